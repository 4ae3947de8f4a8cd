"""FPA's part of the single-token decoding step: the gate map of a new token and the path-minimum update and bias of
the cached keys, as readable definitions (naive) and Triton helpers (kernels) that ops/decode/step's ops call."""
