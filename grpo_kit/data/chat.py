"""Gemma's chat formats (Gemma 2/3's and Gemma 4's): their turn templates, the tokens that end a model turn, and how
a completion is read back.

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


GEMMA4_TOKENS = ("<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>")
"""Gemma 4's control tokens: a turn's start and end, the system turn's switch for thinking, and the channel that holds
the model's thoughts."""
THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>thought\n", "<channel|>"
"""How Gemma 4 writes its thoughts before its answer, in the model's turn."""

# Gemma 4's turn format: a native system turn (which `enable_thinking=True` opens with <|think|>), each turn ended by
# <turn|>; with thinking off the generation prompt closes an empty thought channel, so the model answers directly.
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set thinking = enable_thinking | default(false) -%}"
    "{%- set ns = namespace(system=none) -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = messages[0]['content'] | trim -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- if thinking or ns.system is not none -%}"
    "{{ '<|turn>system\n' + ('<|think|>\n' if thinking else '') + (ns.system or '') + '<turn|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<|turn>' + role + '\n' + (message['content'] | trim) + '<turn|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|turn>model\n' }}{%- if not thinking -%}{{ '<|channel>thought\n<channel|>' }}{%- endif -%}"
    "{%- endif -%}"
)


def _has_token(tokenizer: Any, token: str) -> bool:
    """Is `token` one token of the vocabulary? (A lookup, not `get_vocab()`, which copies the whole vocabulary.)"""
    found = tokenizer.convert_tokens_to_ids(token)
    return found is not None and found != tokenizer.unk_token_id


def is_gemma4_chat(tokenizer: Any) -> bool:
    """Does the tokenizer speak Gemma 4's turn format (its vocabulary holds `<|turn>` and `<turn|>`)?"""
    return _has_token(tokenizer, "<|turn>") and _has_token(tokenizer, "<turn|>")


def turn_end(tokenizer: Any) -> str:
    """The token that closes a model turn: Gemma 4's `<turn|>`, Gemma 2/3's `<end_of_turn>`, else end of sequence."""
    if is_gemma4_chat(tokenizer):
        return "<turn|>"
    return "<end_of_turn>" if _has_token(tokenizer, "<end_of_turn>") else tokenizer.eos_token


def decode_completions(tokenizer: Any, ids: list[list[int]]) -> list[str]:
    """Completion texts as the rewards read them, special tokens dropped. A Gemma 4 completion's thought channel
    (`<|channel>thought\n…<channel|>`) becomes the answer format's reasoning block, so that a thinking model's
    thoughts count as its reasoning; an empty channel is dropped."""
    if not is_gemma4_chat(tokenizer):
        return tokenizer.batch_decode(ids, skip_special_tokens=True)
    from .answer_format import REASONING_CLOSE, REASONING_OPEN

    specials = set(tokenizer.all_special_tokens) | set(GEMMA4_TOKENS)
    texts = []
    for text in tokenizer.batch_decode(ids, skip_special_tokens=False):
        before, opened, rest = text.partition(THOUGHT_OPEN)
        if opened:
            thought, closed, after = rest.partition(THOUGHT_CLOSE)
            text = before + (f"{REASONING_OPEN}{thought.strip()}{REASONING_CLOSE}" if thought.strip() else "") + after
        for token in specials:
            text = text.replace(token, "")
        texts.append(text)
    return texts


def ensure_chat_template(tokenizer: Any) -> Any:
    """Give a tokenizer Gemma's chat template when its checkpoint has none (e.g. GGUF files)."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a completion: `<eos>` and the end of a turn (`turn_end`: Gemma 4's `<turn|>`, Gemma 2/3's
    `<end_of_turn>`)."""
    return sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(turn_end(tokenizer))})
