"""Each public SWE dataset format graded the way its own harness grades it.

A module per format turns a row, in the layout its source publishes, into a Task whose metadata carries what the
sandbox needs to grade exactly as that harness does: the image, the eval script (byte-identical where the harness
writes one), the log parser's name (a key of swebench's PARSER_REGISTRY, or of the extra parsers in
`services/sandbox/images/parsers/`) and the resolution rule. A row this package cannot grade yet is refused at load
time, with the repo family named, never scored zero.

  swebench   princeton-nlp rows (SWE-bench full / Lite / Verified / Multimodal / Multilingual): swebench 4.1's
             per-repo, per-version specs, vendored as data (`data/swebench_4_1_specs.json`).
  swe_gym    SWE-Gym rows: the SWE-Gym fork's specs on top of swebench's.
  swesmith   SWE-smith rows: repo profiles (test command and parser per language), the image's HEAD as the base.
  r2e        R2E-Gym rows: R2E's runtime (tests linked in from `/r2e_tests`, its keys, its exact-match rule).
"""
