"""Which documents of a rerank request go to the cross-encoder in one call.

TextRerankPipeline (openvino-genai 2026.4.1) tokenizes a call's pairs with the query once
and the documents as one batch, and the tokenizer's pair-combining step (CombineSegments
of openvino_tokenizers 2026.4.1) sizes its output for the query's tokens twice and the
documents' tokens twice, where writing it takes the query's tokens once per document. So
a call of `n` documents whose `D` content tokens (special ones not counted) are fewer than
`(n - 2)` times the query's `q` tokens writes past that buffer: the heap is corrupted (the
process aborts with `malloc(): invalid size`, `double free`, or fails the step's own
`out_offset <= flat_out_size` check afterwards). Measured on the random-weight
cross-encoder of the tests: every call with `(n - 2) * q > D` failed, every call with
`(n - 2) * q <= D` was correct (docs/known-issues.md has the report).

So the documents are split into groups each of which keeps `(n - 2) * q <= D`: a group of
one or two documents always does. The pipeline cuts a pair to the model's limit, which
can only shorten what is written; the bound here takes the query at its full length and
each document at the least the cut leaves it (half of the pair's room, when the query
fits in the other half; a longer query gets groups of two), so it holds whatever the cut
does. A score does not depend on the other pairs of its call (each pair
is its own row, padding masked), so grouping changes no score.
"""

from __future__ import annotations

from collections.abc import Sequence


def safe_groups(query_tokens: int, document_tokens: Sequence[int], pair_room: int) -> list[list[int]]:
    """Indexes of the documents, in order, in groups the pipeline can take in one call.
    Token counts are content tokens (without special ones); `pair_room` is what a pair
    may hold of query and document together once the model's limit is applied."""
    if 2 * query_tokens > pair_room:  # the cut may take from the documents: no bound on what they keep
        return [list(range(start, min(start + 2, len(document_tokens)))) for start in range(0, len(document_tokens), 2)]
    keeps_at_least = max(1, pair_room // 2)
    groups: list[list[int]] = []
    group: list[int] = []
    room = 0  # the group's document tokens, each at the least the cut leaves it
    for index, tokens in enumerate(document_tokens):
        least = min(tokens, keeps_at_least)
        if group and not is_safe(query_tokens, len(group) + 1, room + least):
            groups.append(group)
            group, room = [], 0
        group.append(index)
        room += least
    if group:
        groups.append(group)
    return groups


def is_safe(query_tokens: int, documents: int, document_tokens: int) -> bool:
    """Whether one call of `documents` documents of `document_tokens` content tokens in
    all, against a query of `query_tokens`, stays within the pair-combining step's buffer."""
    return (documents - 2) * query_tokens <= document_tokens
