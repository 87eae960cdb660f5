"""Answer quality: `ragspec eval` (evaluate: every question of a set answered as `ragspec ask`
answers it; quality: the measures — snippet held, repetition, refusal) and the retrieval
evaluation over the question sets (retrieval: `python -m ragspec.eval.retrieval`)."""
