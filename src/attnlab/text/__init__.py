"""Text into tokens: every tokenizer attnlab reads, and the n-gram floors."""
