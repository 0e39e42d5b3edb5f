"""Two releases of one implementation under one NAME, for the baseline self-check (tests/test_runners.py):
``tests.twins:Release1`` is the zoo's float64 reference; ``tests.twins:Release2`` is the same but for its sdpa,
which ignores an explicit scale (zoo/broken_scale_ignored.py). Compared under one name, the second release's report
against the first's names exactly the clauses it broke."""
from zoo import _reference as reference
from zoo import broken_scale_ignored

NAME = "twin_attention"


class Release1:
    NAME = NAME
    VERSION = "1.0"
    DTYPES = ("float32", "float64")
    softmax = staticmethod(reference.softmax)
    sdpa = staticmethod(reference.sdpa)
    multi_head_attention = staticmethod(reference.multi_head_attention)


class Release2(Release1):
    VERSION = "2.0"
    sdpa = staticmethod(broken_scale_ignored.sdpa)
