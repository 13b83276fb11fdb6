"""A tiny causal-LM policy for GRPO tests: a 2-layer Llama (hidden size 32, random weights) with the
all-MiniLM-L6-v2 word-piece tokenizer (offline) and a plain chat template. A GRPO step on it takes about a second
on one CPU thread, where SmolLM2-135M takes tens of seconds; it trains and saves like any transformers model.

Placed at PPO_OUT/local/base_policy before the PPO flow runs, it is the base policy the flow reuses (the flow
converts the embedded GGUF only when that folder is missing).
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def build_tiny_policy(dest: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from evolforge.testing.ppo_models import minilm_dir

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(minilm_dir(), model_input_names=["input_ids", "attention_mask"])
    tok.chat_template = CHAT_TEMPLATE
    tok.eos_token = tok.sep_token
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    dest = Path(dest)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest
