"""llama.cpp's shared libraries, loaded before numpy's.

Every spectool module that imports numpy imports this one first, so that whichever way a program comes in (the
command line, `serve`, `worker`, the benchmarks, `import spectool.verify` from a script) llama.cpp's libraries
are mapped before numpy's. On an NVIDIA H200 (CUDA 13, numpy 2.5.2 with scipy-openblas 0.3.34) a process that had
imported numpy first segfaulted inside `llama_model_load_from_file` on every load, `-ngl 0` included, while the
other order worked. `import llama_cpp` gives the working order: its first module loads libllama and libggml*
(llama_cpp/llama_cpp.py) before its second imports numpy (llama_cpp/llama.py).

`spectool --help` imports neither. A program of your own that imports numpy before spectool should import
`spectool.native` (or `llama_cpp`) before numpy (README, Troubleshooting).
"""

import llama_cpp  # noqa: F401 - the import is the point

lib = llama_cpp
