"""Evaluation: pass@k, maj@k and mean@n with 95% intervals, from scored samples.

    estimators.py   the statistics: unbiased pass@k, maj@k over k-subsets, Wilson, bootstrap
    answers.py      the extracted answer of a response, per data_source, for majority voting
    report.py       samples -> metrics per data_source; eval.json, the markdown table, the picture

Nothing here generates or scores: the trainer hands over scored samples (trainer/evaluation.py).
"""
