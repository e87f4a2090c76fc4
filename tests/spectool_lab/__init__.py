"""spectool_lab: what tests/, benchmarks/ and research/ share, one package installed beside spectool
(pyproject.toml finds it here, in tests/spectool_lab/; the test extra brings what it imports).

- common: the real prompts (HumanEval, ShareGPT: the tuning list and unseen samples, related
  requests in a row), the demo model and its F16 / F32 variants, the machine a result came from;
- extraction: JSON extraction under a schema, its prompts and how its outputs are scored;
- replay: lookup's drafting replayed at measured batch costs, and the oracle that bounds it;
- llamacpp: llama.cpp's own tools built from the vendored sources: the tests' oracle, the
  benchmarks' baseline;
- helpers, tinymodels, loadmix: spectool as a process and a server, tiny generated models, a
  server's load.

spectool never imports it (tests/test_layout.py). Importing any of it loads llama.cpp's libraries
before numpy, as spectool does (spectool/llama/native.py says why).
"""

import spectool.llama.native  # noqa: F401 - llama.cpp's libraries before numpy, whichever first
