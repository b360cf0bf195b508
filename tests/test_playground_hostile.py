"""The playground against what others hand it: a conversation file someone sent, a
request kept by an earlier page, replies and model names written to run script, and
replies shaped to make the renderer slow. Driven in headless Chromium (tests/browser.py)
against a real server on the embedded model.

A snippet is proven by what a shell and Python make of it: `shlex` splits the curl
snippet into exactly the words intended and `bash -c` runs it in an empty folder that
stays empty; `ast` finds in the Python snippet only the calls it should make, with
literal arguments equal to the request.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from browser import browser  # noqa: F401 (the fixture)
from conftest import MODEL
from test_playground import STORE, open_page, page_ready, send, stored, wait_for_reply
from test_playground_ui import chat_stream

pytestmark = pytest.mark.browser

HOSTILE_PATH = "/v1/chat/completions -o /dev/null; touch PWNED; echo "
# Strings that end a quote, start a command or a comment, in a shell or in Python.
HOSTILE_STRINGS = (
    "'; touch PWNED_QUOTE; echo '",
    "$(touch PWNED_SUBSHELL)",
    "`touch PWNED_BACKTICK`",
    '"; touch PWNED_DOUBLE; echo "',
    "\nJSON\ntouch PWNED_HEREDOC\n",
    "\\'; touch PWNED_BACKSLASH #",
    "\u2028\"\"\"; __import__('os').system('touch PWNED_PY') #",
    "'''; __import__('os').system('touch PWNED_PY2'); '''",
    "\x00\x1b[2J\u0085\ud7ff end",
)


def curl_argv(snippet: str) -> list[str]:
    """The words a POSIX shell makes of a curl snippet (its `\\`-newline continuations
    joined, its comment lines dropped)."""
    return shlex.split(snippet.replace("\\\n", ""), comments=True)


def curl_body(snippet: str) -> Any:
    argv = curl_argv(snippet)
    return json.loads(argv[argv.index("-d") + 1])


ALLOWED_CALLS = {
    "OpenAI",
    "print",
    "client.chat.completions.create",
    "client.responses.create",
    "client.responses.connect",
    "connection.send",
}
REQUEST_CALLS = ("client.chat.completions.create", "client.responses.create", "connection.send")
ALLOWED_NAMES = {"os", "OpenAI", "client", "stream", "chunk", "event", "connection", "print"}


def python_request(snippet: str) -> dict:
    """What the Python snippet sends (its call's literal arguments), once checked to
    import, name and call only what a snippet should."""
    tree = ast.parse(snippet)
    imports = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == ["import os", "from openai import OpenAI"]
    calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert calls <= ALLOWED_CALLS, calls - ALLOWED_CALLS
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert names <= ALLOWED_NAMES, names - ALLOWED_NAMES
    sent: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in REQUEST_CALLS:
            for arg in node.args:  # connection.send({...})
                sent.update(ast.literal_eval(arg))
            for keyword in node.keywords:  # create(model=..., extra_body={...})
                value = ast.literal_eval(keyword.value)
                if keyword.arg == "extra_body":
                    sent.update(value)
                else:
                    sent[keyword.arg] = value
    return sent


def run_in(folder: Path, argv: list[str], **options: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "OVTRIO_API_KEY": "sk-from-the-environment"}
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120, **options)


def import_file(page, folder: Path, document: Any) -> str:
    """Imports `document` (written as JSON) and returns what the page said about it."""
    path = folder / "sent-to-me.json"
    path.write_text(json.dumps(document))
    page.evaluate("document.querySelector('#toast').textContent = ''")
    page.set_input_files("#import-file", str(path))
    page.wait_for_function("() => document.querySelector('#toast').textContent")
    return page.text_content("#toast")


def reply_with(request: dict, **extra: Any) -> list[dict]:
    return [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi.", "request": request, "stats": {"mode": "chat", "model": MODEL}, **extra},
    ]


def chat_body(content: str) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 1,
    }


# ---- imports and what the page kept ------------------------------------------------------------


def test_an_import_is_read_against_the_conversation_schema(browser, server, tmp_path):
    watched = open_page(browser, server)
    page = watched.page
    page_ready(page)
    good = {"mode": "chat", "path": "/v1/chat/completions", "body": chat_body("Hello")}
    document = {
        "format": "ovtrio-playground-conversations",
        "conversations": [
            {"id": "c_path", "title": "a path", "messages": reply_with({**good, "path": HOSTILE_PATH})},
            {"id": "c_mode", "title": "a mode", "messages": reply_with({**good, "mode": "constructor"})},
            {"id": "c_title", "title": 5, "messages": []},
            {"id": "c_body", "title": "a body", "messages": reply_with({**good, "body": "touch PWNED"})},
            {"id": "c_stats", "title": "stats", "messages": reply_with(good, stats={"model": {"toString": "x"}})},
            {
                "id": "c_good",
                "title": "kept",
                "onclick": "window.__pwned = 1",
                "messages": reply_with({**good, "script": "<script>"}, html="<img src=x onerror=alert(1)>"),
            },
        ],
    }
    said = import_file(page, tmp_path, document)
    assert said.startswith("Imported 1 conversation. 5 left out: conversations[0].messages[1].request.path: ")
    assert HOSTILE_PATH.strip() in said and "/v1/chat/completions" in said
    kept = stored(page)
    assert [c["id"] for c in kept] == ["c_good"]
    assert set(kept[0]) == {"id", "title", "created", "updated", "messages"}
    assert set(kept[0]["messages"][1]) == {"role", "content", "request", "stats"}
    assert kept[0]["messages"][1]["request"] == good

    # Each refusal names its field.
    for conversation, field in (
        (document["conversations"][1], "request.mode"),
        (document["conversations"][2], "conversations[0].title: must be a string, not number 5"),
        (document["conversations"][3], "request.body: must be an object"),
        (document["conversations"][4], "stats.model: must be a string, number or boolean"),
    ):
        said = import_file(page, tmp_path, [conversation])
        assert said.startswith("None of the file's conversations could be read: ") and field in said, said
    assert [c["id"] for c in stored(page)] == ["c_good"]
    watched.check()
    page.context.close()


def test_a_request_kept_before_imports_were_checked_is_dropped_unless_the_page_sends_it(browser, server):
    watched = open_page(browser, server)
    page = watched.page
    page_ready(page)
    good = {"mode": "chat", "path": "/v1/chat/completions", "body": chat_body("Hello")}
    for id, request in (("c_kept", good), ("c_hostile", {**good, "path": HOSTILE_PATH})):
        record = {"id": id, "title": id, "created": 1, "updated": 2, "messages": reply_with(request)}
        page.evaluate(STORE, record)
    page.reload()
    page_ready(page)
    copies = {}
    for id in ("c_kept", "c_hostile"):
        page.click(f".conv[data-id='{id}'] .conv-title")
        page.wait_for_selector(f".conv[data-id='{id}'].active")
        copies[id] = page.get_by_role("button", name="Copy as curl").count()
    assert copies == {"c_kept": 1, "c_hostile": 0}
    watched.check()
    page.context.close()


# ---- snippets ------------------------------------------------------------------------------------


SNIPPETS = """async ([request, withKey]) => {
    const snippets = await import('/playground/js/snippets.js');
    return [snippets.curlSnippet(request, withKey), snippets.pythonSnippet(request, withKey)];
}"""


@pytest.mark.parametrize("mode", ["chat", "responses", "socket"])
@pytest.mark.parametrize("with_key", [False, True])
def test_every_value_in_a_snippet_is_quoted_for_its_language(browser, server, tmp_path, mode, with_key):
    """The snippet functions alone, given a request the page would never keep: a path
    that ends the URL and starts a command, and hostile strings in every value."""
    watched = open_page(browser, server)
    page = watched.page
    body: dict[str, Any] = {"model": "m'; touch PWNED_MODEL; echo '", "stream": mode != "socket"}
    body["messages" if mode == "chat" else "input"] = [{"role": "user", "content": s} for s in HOSTILE_STRINGS]
    if mode == "chat":
        body["stop"] = list(HOSTILE_STRINGS[:2])
    else:
        body["instructions"] = HOSTILE_STRINGS[6]
    body["x'; touch PWNED_KEY; echo '"] = {"$(touch PWNED_NESTED)": [1.5, None, True, "`touch PWNED_LIST`"]}
    request = {"mode": mode, "path": HOSTILE_PATH, "body": body}
    curl, python = page.evaluate(SNIPPETS, [request, with_key])

    expected_body = {**body, "stream": True} if mode == "socket" else body
    key = ["-H", "Authorization: Bearer $OVTRIO_API_KEY"] if with_key else []
    assert curl_argv(curl) == [
        "curl",
        "-N",
        server.base_url + HOSTILE_PATH,
        "-H",
        "Content-Type: application/json",
        *key,
        "-d",
        json.dumps(expected_body, indent=2, ensure_ascii=False),
    ]
    assert curl_body(curl) == expected_body
    run_in(tmp_path, ["bash", "-c", curl])
    assert list(tmp_path.iterdir()) == []

    sent = python_request(python)
    assert sent == ({"type": "response.create", **body} if mode == "socket" else body)
    run_in(tmp_path, [sys.executable, "-c", python])
    assert list(tmp_path.iterdir()) == []
    watched.check()
    page.context.close()


def test_the_snippets_of_an_imported_reply_run_one_request_and_nothing_else(browser, server, tmp_path):
    """Hostile strings that are values of the right type survive an import: the
    snippets copied from the reply send them to the server as values, and only that."""
    watched = open_page(browser, server)
    page = watched.page
    page_ready(page)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    body = chat_body("\n".join(HOSTILE_STRINGS))
    body["stop"] = list(HOSTILE_STRINGS[:2])
    request = {"mode": "chat", "path": "/v1/chat/completions", "body": body}
    document = {"conversations": [{"id": "c_sent", "title": "sent to me", "messages": reply_with(request)}]}
    assert import_file(page, tmp_path, document) == "Imported 1 conversation."
    empty = tmp_path / "empty"
    empty.mkdir()
    page.wait_for_selector(".conv[data-id='c_sent'].active")

    page.get_by_role("button", name="Copy as curl").click()
    curl = page.evaluate("navigator.clipboard.readText()")
    assert curl_argv(curl) == [
        "curl",
        "-N",
        server.base_url + "/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(body, indent=2, ensure_ascii=False),
    ]
    ran = run_in(empty, ["bash", "-c", curl])
    assert ran.returncode == 0 and "data: [DONE]" in ran.stdout, ran.stderr
    assert list(empty.iterdir()) == []

    page.get_by_role("button", name="Copy as Python").click()
    python = page.evaluate("navigator.clipboard.readText()")
    assert python_request(python) == body
    ran = run_in(empty, [sys.executable, "-c", python])
    assert ran.returncode == 0, ran.stderr
    assert list(empty.iterdir()) == []
    watched.check()
    page.context.close()


# ---- replies and model names that try to run script -----------------------------------------------

# Each would set window.__pwned if anything the model wrote became markup, a handler or
# a followed link.
PWN = "window.__pwned=1"
HOSTILE_REPLIES = (
    f"<script>{PWN}</script>",
    f"<img src=x onerror={PWN}>",
    f'<svg onload="{PWN}"><circle r=5 /></svg>',
    f"<svg><script>{PWN}</script></svg>",
    f"<iframe src=javascript:{PWN}></iframe>",
    f"<a href=javascript:{PWN}>a link</a>",
    f"<details open ontoggle={PWN}>x</details> <body onload={PWN}>",
    f"<math><mtext><img src=x onerror={PWN}></mtext></math>",
    f"<style>@import 'javascript:{PWN}'</style><object data=javascript:{PWN}></object>",
    f"[plain](javascript:{PWN})",
    f"[upper](JaVaScRiPt:{PWN})",
    f"[spaced]( javascript:{PWN})",
    f"[tabbed](java\tscript:{PWN})",
    f"[control](\x01javascript:{PWN})",
    f"[entity](&#106;avascript:{PWN}) [colon](javascript&colon;{PWN})",
    f"[percent](%6Aavascript:{PWN})",
    "[vb](vbscript:msgbox(1))",
    "[data](data:text/html;base64,PHNjcmlwdD53aW5kb3cuX19wd25lZD0xPC9zY3JpcHQ+)",
    f"<javascript:{PWN}> and [ref][1]\n\n[1]: javascript:{PWN}",
    f"![image](javascript:{PWN}) ![image](x onerror={PWN})",
    f"| <img src=x onerror={PWN}> | [cell](javascript:{PWN}) |\n|---|---|\n| a | b |",
    f"$\\href{{javascript:{PWN}}}{{click}}$",
    f"$$\\url{{javascript:{PWN}}}$$",
    f'$\\htmlId{{x}}{{y}}$ $\\htmlData{{onclick={PWN}}}{{y}}$ $\\class{{x" onmouseover="{PWN}}}{{y}}$',
    f"$\\includegraphics{{javascript:{PWN}}}$ $\\htmlStyle{{background:url(javascript:{PWN})}}{{y}}$",
    "$\\def\\x{\\x\\x}\\x$ and $\\gdef\\y#1{\\y{#1#1}}\\y{a}$",
    f"```html\n<script>{PWN}</script>\n<img src=x onerror={PWN}>\n```",
    f"```javascript:{PWN}\nalert(1)\n```",
    f"`<img src=x onerror={PWN}>` and ``<svg onload={PWN}>``",
    f"<think><img src=x onerror={PWN}></think>The answer.",
    f"**<b onclick={PWN}>bold</b>** *<i onmouseover={PWN}>em</i>*",
    f"> <img src=x onerror={PWN}>\n> - [quoted](javascript:{PWN})",
    f'https://example.org/"onmouseover="{PWN}" www.example.org/<script>{PWN}</script>',
)
HOSTILE_MODELS = (
    f"<img src=x onerror={PWN}>",
    f'"><script>{PWN}</script>',
    f"javascript:{PWN}",
)

# Every attribute of the page that would run script or follow a link, and every element
# that would be markup from a reply (KaTeX's own math and SVG are its nodes).
INERT = """() => {
    const all = [...document.querySelectorAll('*')];
    const handlers = all.flatMap((e) => [...e.attributes]
        .filter((a) => a.name.startsWith('on')).map((a) => e.tagName + ' ' + a.name));
    const links = all.flatMap((e) => ['href', 'src', 'action', 'formaction', 'data', 'xlink:href']
        .map((name) => e.getAttribute(name)).filter((v) => v !== null)
        .map((v) => new URL(v, document.baseURI).protocol)
        .filter((p) => !['http:', 'https:', 'mailto:'].includes(p)).map((p) => e.tagName + ' ' + p));
    const tags = 'script, iframe, object, embed, style, link, meta, base, img, svg, math, form, body, frame';
    const markup = [...document.querySelectorAll(`#messages :is(${tags})`)]
        .filter((e) => !e.closest('.katex')).map((e) => e.tagName);
    return { handlers, links, markup };
}"""


class HostileServer:
    """Lists HOSTILE_MODELS and answers a message `case N` with HOSTILE_REPLIES[N]."""

    def __init__(self) -> None:
        self.models: list[str] = []

    def __call__(self, page) -> None:
        def answer(route) -> None:
            body = json.loads(route.request.post_data)
            self.models.append(body["model"])
            case = int(body["messages"][-1]["content"].split()[-1])
            route.fulfill(status=200, content_type="text/event-stream", body=chat_stream(HOSTILE_REPLIES[case]))

        models = {"object": "list", "data": [{"id": name, "object": "model"} for name in HOSTILE_MODELS]}
        page.route("**/v1/chat/completions", answer)
        page.route("**/v1/models", lambda route: route.fulfill(status=200, json=models))


def test_hostile_replies_and_model_names_run_nothing(browser, server):
    """With the page's Content-Security-Policy bypassed, so that only the page's own
    care stands between a reply and the DOM."""
    assert len(HOSTILE_REPLIES) == 33
    fake = HostileServer()
    watched = open_page(browser, server, setup=fake, bypass_csp=True)
    page = watched.page
    page.wait_for_function(f"() => document.querySelector('#model').options.length === {len(HOSTILE_MODELS)}")
    assert page.locator("#model option").all_text_contents() == list(HOSTILE_MODELS)
    for case in range(len(HOSTILE_REPLIES)):
        page.select_option("#model", index=case % len(HOSTILE_MODELS))
        send(page, f"case {case}")
        wait_for_reply(page)
    assert fake.models == [HOSTILE_MODELS[case % len(HOSTILE_MODELS)] for case in range(len(HOSTILE_REPLIES))]
    # Code highlighted and math typeset (or refused by KaTeX) before looking.
    page.wait_for_function(
        "() => !document.querySelector('#messages .math:not([data-done]), #messages code[data-lang]:not([data-done])')"
    )
    assert page.locator("#messages .katex").count() >= 5
    assert page.locator(".msg.assistant").count() == len(HOSTILE_REPLIES)
    for element in page.locator("#messages .link-refused").all():
        element.click()
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate(INERT) == {"handlers": [], "links": [], "markup": []}
    # The text is shown as written.
    shown = page.inner_text("#messages")
    assert f"<img src=x onerror={PWN}>" in shown and f"<script>{PWN}</script>" in shown
    watched.check()
    page.context.close()


# ---- replies shaped to make the renderer slow --------------------------------------------------------

# Replies of about `n` characters: nested blocks, and runs of markers that open a span
# whose closer never comes.
SHAPES = """{
    // Each line a level deeper than the one before.
    nested: (n, indent, item) => {
        let s = '';
        for (let i = 0; s.length < n; i++) s += ' '.repeat(indent * i) + item + '\\n';
        return s;
    },
    plain: (n) => 'hello world '.repeat(n / 12),
    'nested list': (n) => nested(n, 2, '- x'),
    'nested numbered list': (n) => nested(n, 3, '1. x'),
    'nested quotes': (n) => '> '.repeat(n / 2) + 'x',
    'quoted lists': (n) => '> - '.repeat(n / 4) + 'x',
    'stars': (n) => '*'.repeat(n),
    'emphasis openers': (n) => '*a '.repeat(n / 3),
    'underscore openers': (n) => '_a '.repeat(n / 3),
    'nested emphasis': (n) => '*a '.repeat(n / 6) + 'b' + ' a*'.repeat(n / 6),
    'strong openers': (n) => '**a '.repeat(n / 4),
    'math openers': (n) => '\\\\( '.repeat(n / 3),
    'escaped dollars': (n) => '$a' + '\\\\$ '.repeat(n / 3),
    'link openers': (n) => '['.repeat(n),
    'empty code spans': (n) => '` '.repeat(n / 2),
}"""
# The least of `reps` renders (and layouts) of a reply of that shape, in a reply's box.
RENDER_TIME = """async ([shape, n, reps]) => {
    const shapes = SHAPES;
    const nested = shapes.nested;
    const { renderMarkdown } = await import('/playground/js/markdown.js');
    const text = shapes[shape](n);
    const box = document.createElement('div');
    box.className = 'msg assistant';
    box.innerHTML = '<div class="content"></div>';
    document.querySelector('#messages').append(box);
    let best = Infinity;
    // A render slower than a few frames is measured once: the noise is small beside it.
    for (let k = 0; k < reps && (k === 0 || best < 300); k++) {
        const started = performance.now();
        box.firstChild.replaceChildren(renderMarkdown(text));
        box.offsetHeight;
        best = Math.min(best, performance.now() - started);
    }
    box.remove();
    return best;
}""".replace("SHAPES", SHAPES)
SHAPE_NAMES = (
    "nested list",
    "nested numbered list",
    "nested quotes",
    "quoted lists",
    "stars",
    "emphasis openers",
    "underscore openers",
    "nested emphasis",
    "strong openers",
    "math openers",
    "escaped dollars",
    "link openers",
    "empty code spans",
)


def test_a_reply_renders_in_time_linear_in_its_length_whatever_its_shape(browser, server):
    """Four times the text takes at most eight times as long (a square would take
    sixteen); a time under the plain text's of the same length, or under 2 ms, counts
    as that."""
    watched = open_page(browser, server)
    page = watched.page
    small, large, reps = 8000, 32000, 7
    page.evaluate(RENDER_TIME, ["plain", small, reps])  # the module loaded and warm
    plain = page.evaluate(RENDER_TIME, ["plain", small, reps])
    ratios = {}
    for shape in SHAPE_NAMES:
        at_small = page.evaluate(RENDER_TIME, [shape, small, reps])
        at_large = page.evaluate(RENDER_TIME, [shape, large, reps])
        # Under 2 ms a time is mostly the timer's and the machine's noise.
        ratios[shape] = round(at_large / max(at_small, plain, 2.0), 1)
    assert all(ratio <= 8 for ratio in ratios.values()), ratios
    watched.check()
    page.context.close()


def test_nesting_deeper_than_a_reader_follows_is_shown_as_its_text(browser, server):
    watched = open_page(browser, server)
    page = watched.page
    shapes = {"nested list": 300, "nested quotes": 2000, "quoted lists": 1000}
    for shape, levels in shapes.items():
        depth, xs = page.evaluate(
            """async ([shapes, shape, levels]) => {
                const { renderMarkdown } = await import('/playground/js/markdown.js');
                const text = shape === 'nested list'
                    ? Array.from({ length: levels }, (_, i) => ' '.repeat(2 * i) + '- x').join('\\n')
                    : (shape === 'nested quotes' ? '> ' : '> - ').repeat(levels) + 'x';
                const box = document.createElement('div');
                box.append(renderMarkdown(text));
                const deepest = (e) => 1 + Math.max(0, ...[...e.children].map(deepest));
                return [deepest(box), (box.textContent.match(/x/g) || []).length];
            }""",
            [SHAPES, shape, levels],
        )
        # Sixteen levels of two elements (a list and its item), then the rest as text.
        assert depth <= 2 * 16 + 8, (shape, depth)
        assert xs == (levels if shape == "nested list" else 1), shape
    watched.check()
    page.context.close()
