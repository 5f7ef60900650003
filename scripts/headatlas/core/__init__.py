"""The spine: corpora, tokenisation and alignment, models, extraction, the attention store, file and rule helpers."""
