"""The verdict on one case: called, contained, judged against the oracle, attributed, recorded.

``containment`` calls the implementation (time limit, input copies, the result's contract); ``expected`` asks the
reference for the case's output and allowed error; ``verdict`` (the Judge) compares, explains the worst element and
words the failure (``messages``); ``attribution`` blames the clause at fault; ``records`` keeps every case's
outcome; ``evidence`` saves each failure's repro; ``fixtures``, ``gradients`` and ``gradient_verdicts`` judge worked
examples and gradients; ``agreement`` keeps outputs for the cross-backend matrix; ``time_limit`` makes the per-test
limit hold under Hypothesis.
"""
