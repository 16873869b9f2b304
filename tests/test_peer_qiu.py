"""benchmarks/peer_qiu.py: the edits to Qiu et al.'s script apply exactly once, and a script that changed fails loudly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("peer_qiu", ROOT / "benchmarks" / "peer_qiu.py")
peer_qiu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer_qiu)

# the lines of countdown/es_fine-tuning_countdown.py (commit 523afc8) the benchmark edits, as they stand there
THEIRS = '''NUM_ITERATIONS = 500             # Number of ES iterations (generations)
POPULATION_SIZE = 30              # Population size (number of perturbations per iteration)
max_new_tokens = 1024              # Maximum number of tokens allowed to be generated
        model_list.append(AutoModelForCausalLM.from_pretrained(
            device_map={"": accelerator.process_index},  # Assign devices explicitly
            print(f"GPU Memory: {torch.cuda.memory_allocated() / 1024**2:.2f}MB allocated")
'''


def test_the_sizes_and_the_cpu_device_are_set_and_the_cuda_print_is_gone():
    out = peer_qiu.patch_script(THEIRS, iterations=3, population=8, max_new_tokens=16)
    assert "NUM_ITERATIONS = 3 " in out and "POPULATION_SIZE = 8 " in out and "max_new_tokens = 16 " in out
    assert 'device_map={"": "cpu"}' in out and "accelerator.process_index" not in out
    assert "GPU Memory" not in out and "            pass" in out


def test_a_changed_script_is_refused_naming_the_edit():
    with pytest.raises(SystemExit, match="POPULATION_SIZE.*matched 0 times"):
        peer_qiu.patch_script(THEIRS.replace("POPULATION_SIZE = 30", "POP = 30"), 1, 2, 4)
