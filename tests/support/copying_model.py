"""A model that copies, for the source view's browser tests: a one-layer Llama whose weights
are set by hand so that its greedy next token depends only on the current token, following a
chain through the characters of a phrase (each character once) and back. Put the phrase in a
passage and the n-gram drafter finds it in the prompt: the answer's accepted drafts are then real
copies from that passage, made by the real engine, verified by the model, cited by the real
citation path. Its answer is "PHRASE|PHRASE|..." until the token limit."""

from __future__ import annotations

from pathlib import Path

BREAK = "|"


def copying_model_folder(path: Path, phrase: str) -> Path:
    """Save, under `path`, a character-tokenizer model whose greedy answer repeats `phrase`."""
    import torch
    from conftest import make_char_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    if len(set(phrase)) != len(phrase) or BREAK in phrase:
        raise ValueError(f"each character of the phrase must occur once (and no {BREAK!r})")
    tok = make_char_tokenizer()
    tok.eos_token = None
    vocab = tok.get_vocab()
    ids = [vocab[c] for c in phrase]
    size = len(tok)
    hidden = 128
    assert size <= hidden
    cfg = LlamaConfig(vocab_size=size, hidden_size=hidden, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=16384, bos_token_id=1, pad_token_id=0,
                      eos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    nxt = {a: b for a, b in zip(ids, ids[1:], strict=False)}
    nxt[ids[-1]] = vocab[BREAK]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, :size] = torch.eye(size)  # token i: unit vector i
        model.model.norm.weight.fill_(1.0)
        model.model.layers[0].input_layernorm.weight.fill_(1.0)
        model.model.layers[0].post_attention_layernorm.weight.fill_(1.0)
        for a in range(size):  # attention and MLP add nothing: the next token is a table
            model.lm_head.weight[nxt.get(a, ids[0]), a] = 1.0
    model.generation_config.eos_token_id = None
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path
