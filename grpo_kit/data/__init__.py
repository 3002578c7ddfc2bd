"""What the model is asked and how an answer is judged: the tasks (`tasks`: arithmetic, word problems, GSM8K,
your own file via `datafiles`), the answer format (`answer_format`), Gemma's chat template (`chat`) and the
rewards (`rewards`), each reward beside the answer format it checks.

Import rule: the kit's foundations (`options`, `validation`) and this subpackage only.
"""
