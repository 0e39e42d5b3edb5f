"""How the conformance tests run: ``properties`` (property_test: the covering set, the budget of examples, bounded
shrinking), ``checks`` (the helpers every test module shares: a device present, a judge, a check, what a property
needs), ``session`` (what one pytest session shares: the implementations, how the run ended) and ``replay``
(``attention-conformance repro ID``).
"""
