"""Scoring: every position's log-probabilities over a whole token sequence.

The continuous-batching engine returns the log-probability of the chosen token only,
and scores no prompt position whose KV blocks come from its prefix cache. The scoring
path runs the model's own IR with plain OpenVINO inference over the whole sequence
instead and reads each position's distribution (graph.py adds log-softmax, top-k, the
next token's log-probability and its rank to the model's outputs). engine.py is that
inference, blocking, for one sequence at a time; scorer.py is its asynchronous face:
loaded on the first scoring request, run in a worker thread, admitted through the
scheduler like any request.
"""

from ovtrio.scoring.engine import MAX_TOP_LOGPROBS, ScoringEngine, SequenceScores
from ovtrio.scoring.scorer import Scorer, ScoringUnavailable

__all__ = ["MAX_TOP_LOGPROBS", "Scorer", "ScoringEngine", "ScoringUnavailable", "SequenceScores"]
