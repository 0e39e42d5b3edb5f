"""A softmax that normalises over axis -2: the mistake 003_58636e0047490b73.txt prints."""
import numpy as np


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=-2, keepdims=True))
    return e / np.sum(e, axis=-2, keepdims=True)
