"""The testbed's shared word-level vocabulary and its tokenizer.

Every testbed domain writes prompts, traces and answers with the words below, separated by
single spaces; one word is one token. The tokenizer is built locally with `tokenizers`
(WordLevel model, whitespace pre-tokenizer) and wrapped as a Hugging Face fast tokenizer, so
it saves and loads with `save_pretrained` / `AutoTokenizer.from_pretrained` like any other.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
THINK, END_THINK = "<think>", "</think>"
ANSWER = "answer"

SPECIALS = [PAD, BOS, EOS, UNK]
DIGITS = [str(d) for d in range(10)]
SYMBOLS = ["+", "-", "*", "%", "=", ";"]
WORDS = [
    THINK, END_THINK, ANSWER,
    "check", "ok",                  # post-answer confirmation rounds
    "write", "carry", "borrow",     # column arithmetic
    "xor",                          # parity
    "budget",                       # token budget written into a prompt (L1-style strategies)
    "add", "sum", "mul", "chain", "parity", "sub", "mod",   # domain names
]
VOCAB = SPECIALS + DIGITS + SYMBOLS + WORDS


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The testbed tokenizer: one token per word, `<bos>` prepended to every encoded text."""
    vocab = {word: index for index, word in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])]
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    # padding_side must be given to the constructor: setting it afterwards is not saved.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
