"""EuroBERT sizes: the paper's 210m, 610m and 1b (docs/protocol.md) and tiny ones for CPU tests.

Plain data, no torch: config validation and the sweep planner read it without importing transformers.
Common to all sizes (the paper): pre-RMSNorm (eps 1e-5), SwiGLU, no biases, no dropout, untied embeddings,
RoPE theta 10,000. The vocabulary comes from the tokenizer.
The CPU sizes micro < tiny < mini stand for 210m < 610m < 1b in the paper in miniature (sweeps/paper_mini.yaml).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int

    def non_embedding_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.ffn + 2 * self.hidden) + self.hidden

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        return flops_per_token(layers=self.layers, hidden=self.hidden, non_embedding_params=self.non_embedding_params(),
                               vocab_size=vocab_size, seq_len=seq_len)

    def params(self, vocab_size: int) -> int:
        """Parameter count: untied input and output embeddings plus the blocks (RMSNorm weights included)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.ffn
        block = attn + mlp + 2 * self.hidden
        return self.layers * block + 2 * vocab_size * self.hidden + self.hidden


def flops_per_token(*, layers: int, hidden: int, non_embedding_params: int, vocab_size: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (matmul parameters, the untied LM head included) + attention scores
    12 x layers x hidden x seq_len (PaLM, appendix B). The input embedding is a lookup and costs nothing."""
    return 6 * (non_embedding_params + vocab_size * hidden) + 12 * layers * hidden * seq_len


SIZES: dict[str, Size] = {
    "micro": Size(layers=2, hidden=32, heads=2, kv_heads=2, head_dim=16, ffn=96),
    "tiny": Size(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=192),
    "mini": Size(layers=4, hidden=128, heads=4, kv_heads=4, head_dim=32, ffn=384),
    "210m": Size(layers=12, hidden=768, heads=12, kv_heads=12, head_dim=64, ffn=3072),
    "610m": Size(layers=26, hidden=1152, heads=18, kv_heads=6, head_dim=64, ffn=4096),
    "1b": Size(layers=26, hidden=1728, heads=18, kv_heads=6, head_dim=96, ffn=4096),  # (verify) in the paper notes
}
SIZE_NAMES = tuple(SIZES)

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
"""Dense bf16 peak TFLOP/s by GPU name (no sparsity): the MFU denominator in training and the dry run's default."""
