"""A class whose constructor needs an argument: `--impl examples.needs_arguments:Attention` is a
load error (exit 4) saying to pass an instance; `--impl examples.needs_arguments:attention` works."""
import numpy as np


class Attention:
    def __init__(self, causal_by_default):
        self.causal_by_default = causal_by_default

    def softmax(self, x, axis=-1):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


attention = Attention(causal_by_default=False)
