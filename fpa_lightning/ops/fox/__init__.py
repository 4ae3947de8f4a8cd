"""FoX (Forgetting Transformer) attention: the bias b[t, s] = c_t − c_s of a cumulative log forget gate, one signature
two ways, the readable definition (naive, any float dtype) and FlexAttention on the GPU (flex); and ALiBi, the same
bias with c_t = −m_h·t (alibi)."""
from fpa_lightning.ops.fox.alibi import alibi_cumulative, alibi_decode_bias, alibi_slopes
from fpa_lightning.ops.fox.flex import fox_flex_attention
from fpa_lightning.ops.fox.naive import fox_bias, fox_bias_block, naive_fox_attention

__all__ = ["alibi_cumulative", "alibi_decode_bias", "alibi_slopes", "fox_bias", "fox_bias_block",
           "fox_flex_attention", "naive_fox_attention"]
