"""What is run: the cases of every test, and how they are drawn.

``case`` (a Case: one call of one operation on float64 masters), ``fixtures`` (the worked examples of fixtures/,
loaded and checked against the oracle), ``limits`` and ``drawing`` (the case space's sizes, and drawing inside an
implementation's declared region), the Hypothesis strategies by operation (``sdpa``, ``softmax``, ``mha``,
``variants``, ``sequences``, ``fp8``, ``gradients``), ``covering`` (the corners every property runs first),
``support`` (the count of cases an implementation could not run) and ``onnx_attention`` (ONNX's node tests as
fixtures).
"""
