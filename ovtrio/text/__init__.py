"""The model's text: prompts built through its chat template (prompts.py,
template_text.py, added_tokens.py, pieces.py), client text kept as text (plain_text.py),
the byte string of every token (vocabulary.py), and the formats its template teaches
(chat_format.py)."""
