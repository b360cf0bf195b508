"""A model's files, opened trusting nothing about what sits under their names
(regular_files.py), and the JSON files beside a model (json_files.py)."""
