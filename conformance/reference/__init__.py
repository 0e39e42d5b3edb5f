"""The reference: what attention should compute, and how far a correct implementation may be from it.

``oracle`` (float64 attention as the spec defines it; ``oracle.attention`` keeps every intermediate of a case),
``backward`` (its analytic gradients), ``blocked`` (the oracle and the allowed error a block of rows at a time, for
large shapes), ``tolerances`` (the tolerance model of spec/tolerances.yaml, fed the oracle's intermediates) and
``output_forms`` (packed outputs in the judge's form).
"""
