"""An example evolm plugin: the ``vowel_words`` task and the ``vowel_share`` / ``mostly_vowels`` functions."""
