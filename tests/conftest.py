import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/tiny.py, tests/synthetic.py, ...
torch.set_num_threads(1)  # tiny models: extra threads only add contention on a 2-core machine

pytest_plugins = ["fixtures_packs"]  # the session fixture that pulls the SmolLM2 pack
