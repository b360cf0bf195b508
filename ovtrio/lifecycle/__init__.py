"""What every served model's lifecycle shares, whatever its kind: the leases requests
hold on it, and when a model whose load failed is loaded again (load_retry.py). The
rules that decide when a model loads and unloads are the serving package's
(ovtrio/serving/residency.py)."""
