"""Drafters: each proposes up to K next tokens for one request (see base.py for the protocol).

base.py           the Proposer protocol, Draft, AdaptiveK, the registry and the `auto` order
prediction.py     Predicted Outputs: walk the caller's expected text, re-anchor after edits
substitutions.py  edits learned from divergences, applied to the rest of a prediction
prompt.py         `auto` without a prediction: the prompt's code drafted as the prediction
ngram.py          prompt lookup: continue the latest n-gram as it continued before
draft_model.py    a small model of the same vocabulary, with its own cache sequence
"""
