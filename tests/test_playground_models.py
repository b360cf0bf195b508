"""The playground's model picker on a server that loads models on demand (a folder of the
embedded GGUF linked under several names, tests/test_models_on_demand.py): the picker
follows the server without a reload. A chat loads its model and the picker says
"loading" and then "loaded"; an unload by hand shows when the picker is opened; a file
copied into the folder appears on the page's own timer (Playwright's clock, advanced by
the test rather than waited for), nothing is asked while the page is hidden, and a
chosen model that leaves the folder stays chosen, marked so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import loopback
from browser import browser  # noqa: F401 (the fixture)
from conftest import RunningServer
from ovtrio.model import embedded_model_path
from test_models_on_demand import on_demand_server, states, states_folder, unload
from test_playground import configure, open_page, page_ready, send, wait_for_reply
from test_playground_ui import PHONE, axe_violations

pytestmark = pytest.mark.browser

playground_on_demand = on_demand_server("playground_on_demand")

EVERY_MS = 12_000  # the page's interval (models.js)
SEEN = 30_000  # ms the picker may take to show a state the server has


@pytest.fixture
def server(playground_on_demand: RunningServer) -> RunningServer:
    """The folder's server with alpha and beta unloaded."""
    for name in ("alpha", "beta"):
        assert unload(playground_on_demand, name).status_code == 200
    return playground_on_demand


def option_texts(page) -> dict[str, str]:
    return dict(page.eval_on_selector_all("#model option", "os => os.map(o => [o.value, o.textContent])"))


def wait_for_option(page, model: str, text: str) -> None:
    page.wait_for_function(
        "([model, text]) => [...document.querySelectorAll('#model option')]"
        ".some(o => o.value === model && o.textContent === text)",
        arg=[model, text],
        timeout=SEEN,
    )


def model_lists(page) -> list[str]:
    """The /v1/models requests the page makes from now on."""
    seen: list[str] = []
    page.on("request", lambda request: request.url.endswith("/v1/models") and seen.append(request.url))
    return seen


def test_a_chat_shows_its_model_loading_then_loaded_and_an_unload_shows_when_the_picker_opens(browser, server):
    watched = open_page(browser, server)
    page = watched.page
    page_ready(page)
    assert option_texts(page)["alpha"] == "alpha · unloaded"
    assert option_texts(page)["broken"] == "broken · failed"
    page.select_option("#model", "alpha")
    configure(page, max_tokens=2)
    send(page, "Hi")
    # While the request waits for the load: the server's state, in the picker and the reply.
    wait_for_option(page, "alpha", "alpha · loading")
    page.wait_for_selector(".msg.assistant .note.loading:text('Loading alpha on the server…')", timeout=SEEN)
    wait_for_reply(page)
    wait_for_option(page, "alpha", "alpha · loaded")
    assert page.locator(".note.loading").count() == 0
    assert states(server)["alpha"]["value"] == "loaded"
    assert page.input_value("#model") == "alpha"

    assert unload(server, "alpha").status_code == 200
    page.focus("#model")  # the picker opened by the keyboard
    wait_for_option(page, "alpha", "alpha · unloaded")
    assert page.input_value("#model") == "alpha"
    watched.check()
    page.context.close()


def test_on_a_phone_a_tap_on_the_picker_shows_a_load_done_by_another_client(browser, server):
    watched = open_page(browser, server, **PHONE)
    page = watched.page
    page_ready(page)
    assert option_texts(page)["beta"] == "beta · unloaded"
    loaded = loopback.post(server.base_url + "/models/load", json={"model": "beta"}, timeout=120)
    assert loaded.status_code == 200, loaded.text
    page.tap("#model")
    wait_for_option(page, "beta", "beta · loaded")
    # The longer option text still fits the phone's width.
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["viewport"]["width"]
    picker = page.locator("#model").bounding_box()
    assert picker is not None and picker["x"] + picker["width"] <= PHONE["viewport"]["width"]
    watched.check()
    page.context.close()


HIDDEN = """() => {
    window.pageHidden = false;
    Object.defineProperty(document, 'hidden', {configurable: true, get: () => window.pageHidden});
    Object.defineProperty(document, 'visibilityState', {configurable: true,
        get: () => (window.pageHidden ? 'hidden' : 'visible')});
}"""


def show(page, hidden: bool) -> None:
    page.evaluate(f"window.pageHidden = {json.dumps(hidden)}; document.dispatchEvent(new Event('visibilitychange'))")


def test_a_model_copied_in_appears_on_the_timer_never_while_hidden_and_one_removed_stays_chosen(browser, server):
    folder = Path(states_folder(server))
    added = folder / "epsilon.gguf"
    added.unlink(missing_ok=True)

    def setup(page) -> None:
        page.clock.install()
        page.add_init_script(f"({HIDDEN})()")

    watched = open_page(browser, server, setup=setup)
    page = watched.page
    page_ready(page)
    assert "epsilon" not in option_texts(page)
    added.symlink_to(embedded_model_path())
    try:
        page.clock.fast_forward(EVERY_MS)
        wait_for_option(page, "epsilon", "epsilon · unloaded")
        page.select_option("#model", "epsilon")
        added.unlink()
        # Hidden: a minute passes and nothing is asked.
        show(page, hidden=True)
        lists = model_lists(page)
        for _ in range(5):
            page.clock.fast_forward(EVERY_MS)
        page.wait_for_timeout(300)
        assert lists == []
        # Shown again: the list is read at once; the chosen model left the folder and
        # stays chosen, marked so, rather than another being chosen.
        show(page, hidden=False)
        wait_for_option(page, "epsilon", "epsilon · no longer served")
        assert len(lists) == 1
        assert page.input_value("#model") == "epsilon"
        assert "epsilon is no longer served" in page.inner_text("#toast")
        # Sending to it is refused in the page.
        sent_before = len(watched.sent)
        send(page, "Hi")
        refused = "epsilon is no longer served: pick another model."
        page.wait_for_function("text => document.querySelector('#toast').textContent === text", arg=refused)
        assert len(watched.sent) == sent_before
        # Another chosen: the gone one leaves the picker.
        page.select_option("#model", "alpha")
        assert "epsilon" not in option_texts(page)
        assert page.input_value("#model") == "alpha"
        assert "epsilon" not in states(server)
    finally:
        added.unlink(missing_ok=True)
    watched.check()
    page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_reply_waiting_for_its_models_load_says_so_and_axe_finds_nothing_serious(browser, server, scheme):
    """The server's answer is held back and /v1/models says the model loads: the waiting
    reply shows it, on a desktop and a phone."""
    models = {
        "object": "list",
        "data": [{"id": "slow", "object": "model", "kind": "generation", "status": {"value": "loading"}}],
    }
    held: list = []

    def setup(page) -> None:
        page.route("**/v1/models", lambda route: route.fulfill(json=models))
        page.route("**/v1/chat/completions", lambda route: held.append(route))  # never answered

    found = {}
    for where, options in (("desktop", {}), ("phone", PHONE)):
        watched = open_page(browser, server, setup=setup, color_scheme=scheme, **options)
        page = watched.page
        page_ready(page)
        assert option_texts(page) == {"slow": "slow · loading"}
        page.fill("#prompt", "Hi")
        page.click("#send")  # on a phone Enter adds a line
        note = page.wait_for_selector(".msg.assistant .note.loading", timeout=SEEN)
        assert note.inner_text() == "Loading slow on the server…"
        found[where] = axe_violations(page)
        page.context.close()
    failing = {where: v for where, v in found.items() if v}
    assert not failing, "\n".join(f"{where}: {line}" for where, lines in failing.items() for line in lines)
