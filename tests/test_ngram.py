"""The n-gram drafter's continuation: a copy that reaches the end of the text goes round only a
loop the text has already shown twice."""

from specserve.proposers.ngram import NgramProposer, continuation
from specserve.proposers.prediction import PredictionLookup


def test_a_loop_is_drafted_round_and_round():
    tokens = [5, 1, 2, 3, 1, 2, 3]  # "1 2 3" twice in a row: period 3
    draft = NgramProposer(k_init=8, k_max=8).propose(tokens, 8)
    assert draft.token_ids == [1, 2, 3, 1, 2, 3, 1, 2]


def test_a_copy_of_text_seen_once_stops_at_the_end():
    tokens = [7, 1, 2, 3, 9, 1, 2, 3]  # "1 2 3" came twice, but "9 1 2 3" did not: no loop
    assert NgramProposer(k_init=8, k_max=8).propose(tokens, 8).token_ids == [9, 1, 2, 3]
    assert continuation(tokens, 4, 3) == [9, 1, 2]  # and k still caps it


def test_a_period_two_loop_fills_the_whole_draft():
    tokens = [4, 8, 6, 8, 6, 8, 6]  # a small model's "_admin_admin" loop
    assert continuation(tokens, 5, 5) == [8, 6, 8, 6, 8]


def test_the_prediction_lookup_drafts_its_loop_past_the_end():
    """Prediction mode's fallback for new text: on an H200 it drafted a 2-token loop 2 tokens a
    step, the loop's period, where a 128-token pass cost 2.09 one-token passes."""
    lookup = PredictionLookup([10, 11, 12], prompt_len=2, prices=lambda: None, k_init=8, k_max=8)
    tokens = [0, 1] + [20, 21, 22, 21, 22]  # the prompt, then output looping on "21 22"
    assert lookup.propose(tokens, 8).token_ids == [21, 22, 21, 22, 21, 22, 21, 22]
