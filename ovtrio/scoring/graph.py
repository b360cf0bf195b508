"""The scoring model: the language model's graph with its logits turned into what scoring
reads, inside the graph.

The logits of a position are a vector of the vocabulary's size (49,152 floats for the
embedded model): read out whole they would be 200 KB a position, and a log-softmax in
numpy over them slower than the model itself. So the graph computes, per position, the
log-softmax, its `MAX_TOP_LOGPROBS` largest entries (sorted, with their token ids), the
log-probability of the next token (a `target_ids` input: the sequence shifted by one),
and that token's rank (how many tokens are more likely). Measured against numpy's
log-softmax over the read-out logits (f64): within 2e-5.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_TOP_LOGPROBS = 20
OUTPUTS = ("top_logprobs", "top_ids", "token_logprob", "rank")


def scoring_model(model: Any) -> Any:
    """`model` (an ov.Model with a `logits` output [batch, positions, vocabulary]) with the
    scoring outputs of OUTPUTS in place of its logits, and the extra input `target_ids`."""
    import openvino as ov
    from openvino import opset13 as ops

    logits = model.output("logits").get_node().input_value(0)
    logprobs = ops.log_softmax(logits, -1)
    top = ops.topk(
        logprobs,
        ops.constant(np.int64(MAX_TOP_LOGPROBS)),
        axis=-1,
        mode="max",
        sort="value",
        index_element_type=ov.Type.i64,
    )
    target = ops.parameter([-1, -1], ov.Type.i64, name="target_ids")
    target.output(0).set_names({"target_ids"})
    token_logprob = ops.gather_elements(logprobs, ops.unsqueeze(target, ops.constant(np.int64(2))), 2)
    more_likely = ops.convert(ops.greater(logprobs, token_logprob), ov.Type.i32)
    rank = ops.reduce_sum(more_likely, ops.constant(np.int64(2)), keep_dims=True)
    results = []
    for name, value in zip(OUTPUTS, (top.output(0), top.output(1), token_logprob, rank)):
        result = ops.result(value)
        result.output(0).set_names({name})
        results.append(result)
    return ov.Model(results, model.get_sinks(), [*model.get_parameters(), target], "scoring")
