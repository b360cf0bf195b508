"""How a rerank request's documents are split into calls of the cross-encoder pipeline
(ovtrio/embedding/pairs.py): every call stays clear of the tokenizer's buffer overflow."""

from __future__ import annotations

import random

from ovtrio.embedding.pairs import is_safe, safe_groups


def test_the_measured_line_between_safe_and_corrupting_calls() -> None:
    # Calls measured on the cross-encoder fixture: (query tokens, document tokens) -> safe.
    assert not is_safe(5, 3, 1 + 1 + 2)
    assert is_safe(5, 3, 1 + 2 + 2)
    assert not is_safe(4, 5, 3 + 3 + 3 + 2 + 1 - 1)
    assert is_safe(4, 5, 3 + 3 + 3 + 2 + 1)
    assert is_safe(200, 2, 2) and is_safe(600, 1, 1)


def test_groups_keep_every_document_once_in_order_and_each_call_safe() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        query = rng.randint(1, 300)
        documents = [rng.randint(1, 600) for _ in range(rng.randint(1, 64))]
        groups = safe_groups(query, documents, 509)
        assert [index for group in groups for index in group] == list(range(len(documents)))
        for group in groups:
            least = sum(min(documents[index], 509 // 2) for index in group)
            assert len(group) <= 2 or (2 * query <= 509 and is_safe(query, len(group), least))


def test_short_documents_after_a_long_query_go_two_at_a_time() -> None:
    assert safe_groups(9, [1] * 5, 509) == [[0, 1], [2, 3], [4]]
    assert safe_groups(300, [400] * 3, 509) == [[0, 1], [2]]
    assert safe_groups(3, [5] * 6, 509) == [[0, 1, 2, 3, 4, 5]]
