"""Reasoning apart from the answer, for models that think in `<think>…</think>` (Qwen3,
DeepSeek-R1, QwQ): the API returns the thinking as `reasoning_content` and only the answer
as `content`.

Read incrementally like the tool-call parsers: `feed` each generated piece (split
anywhere, even inside a tag), then `finish`; `parse` is the same on the whole text, so
unary and streamed responses agree. Rules:

* The open tag counts only at the very start of the output (after whitespace): a model
  that mentions "<think>" in its answer is not thinking. Templates that already put the
  open tag in the prompt (DeepSeek-R1, QwQ) make the output start inside the reasoning:
  `start_in_reasoning=True`; a repeated open tag at the start is then dropped.
* Reasoning runs to the close tag, or to the end if generation stops first: reasoning
  never leaks into content. It is passed verbatim; whitespace right after the close tag
  (the blank line before the answer) is not part of the content.
* Without an open tag (and not started in reasoning), everything is content; a stray
  close tag there is content too, since the text before it has already been streamed,
  except right at the start: an output that begins by closing the block (a template
  that opened it in a way the prompt's end does not show) has an empty reasoning and
  its answer after the tag.
"""

from __future__ import annotations

from ovtrio.parsing.json_scan import skip_space
from ovtrio.parsing.tool_calls import partial_tag_at_end

# The tags thinking models write around their reasoning.
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ReasoningSplitter:
    def __init__(
        self, start_in_reasoning: bool = False, open_tag: str = THINK_OPEN, close_tag: str = THINK_CLOSE
    ) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._start_in_reasoning = start_in_reasoning
        self._buf = ""
        self._mode = "start"  # "start" (the open tag may still come), "reasoning", "content"
        self._strip_space = False  # content just began after the close tag
        self._blank = 0  # leading whitespace seen at the start (the buffer only grows there)

    def feed(self, text: str) -> tuple[str, str]:
        """The next piece of generated text: (reasoning_delta, content_delta)."""
        self._buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        """End of generation: what was held back, as (reasoning_delta, content_delta)."""
        return self._run(final=True)

    def parse(self, text: str) -> tuple[str, str]:
        """The whole text at once: (reasoning, content)."""
        reasoning, content = self.feed(text)
        more_reasoning, more_content = self.finish()
        return reasoning + more_reasoning, content + more_content

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning, content = [], []
        if self._mode == "start":
            self._at_start(final)
        if self._mode == "reasoning":
            reasoning.append(self._in_reasoning(final))
        if self._mode == "content":
            content.append(self._in_content())
        return "".join(reasoning), "".join(content)

    def _at_start(self, final: bool) -> None:
        """Look for the open tag at the start; until known, hold the text back."""
        self._blank = skip_space(self._buf, self._blank)
        rest = self._buf[self._blank :]
        if rest.startswith(self.open_tag):
            self._buf = rest[len(self.open_tag) :]
            self._mode = "reasoning"
        elif rest.startswith(self.close_tag):
            # The prompt opened the block (in a way not recognised) and the model closed it
            # at once: what follows is the answer.
            self._buf = rest[len(self.close_tag) :]
            self._mode, self._strip_space = "content", True
        elif not final and (self.open_tag.startswith(rest) or self.close_tag.startswith(rest)):
            return  # nothing but whitespace, or a partial tag: wait
        else:
            self._mode = "reasoning" if self._start_in_reasoning else "content"

    def _in_reasoning(self, final: bool) -> str:
        """Reasoning up to the close tag, holding back a possible partial one."""
        at = self._buf.find(self.close_tag)
        if at >= 0:
            reasoning, self._buf = self._buf[:at], self._buf[at + len(self.close_tag) :]
            self._mode, self._strip_space = "content", True
            return reasoning
        keep = 0 if final else partial_tag_at_end(self._buf, self.close_tag)
        reasoning, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return reasoning

    def _in_content(self) -> str:
        if self._strip_space:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return ""  # still only whitespace: the answer has not begun
            self._strip_space = False
        content, self._buf = self._buf, ""
        return content
