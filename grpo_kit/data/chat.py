"""Gemma's chat format: its turn template and the tokens that end a model turn.

Both the hub (converting the offline GGUF, which carries no template) and the model loader need these,
so they live here, below both.
"""

from __future__ import annotations

from typing import Any

# Gemma's turn format. Gemma has no system role: a system message is folded into the first user turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = (messages[0]['content'] | trim) + '\\n\\n' -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (ns.system if loop.first else '') + (message['content'] | trim) + "
    "'<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def ensure_chat_template(tokenizer: Any) -> Any:
    """Give a tokenizer Gemma's chat template when its checkpoint has none (e.g. GGUF files)."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a completion: `<eos>` and the end of a turn, Gemma 2/3's `<end_of_turn>` or Gemma 4's
    `<turn|>` (those the vocabulary has)."""
    ids = [tokenizer.eos_token_id]
    for end in ("<end_of_turn>", "<turn|>"):
        eot = tokenizer.convert_tokens_to_ids(end)
        if eot is not None and eot != tokenizer.unk_token_id:
            ids.append(eot)
    return sorted(set(ids))
