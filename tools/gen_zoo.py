#!/usr/bin/env python3
"""Generate Quicksilver's built-in model zoo as JSON data files.

Run once with an interpreter that has torch and torchvision (scripts/python.sh prints the
project's; the kept files were made by Debian's, torch 1.13 and torchvision 0.14):

    "$(bash scripts/python.sh)" tools/gen_zoo.py --out data/zoo

Each model is built as a torch ``nn.Module`` (torchvision for the vision models, small
modules defined here for VGG-16/CIFAR-10, BERT-Base and GPT-2), run forward once on a
dummy input of batch 1, and described layer by layer in forward (execution) order:

* a *layer* is a module that owns learnable parameters directly (Conv2d, Linear,
  BatchNorm2d, LayerNorm, Embedding);
* its ``forward_flops`` (per sample) are computed analytically from the module type and the
  shapes seen during the forward pass;
* the work of everything that owns no parameters (ReLU, pooling, residual adds, attention
  score/context matmuls, softmax, the tied GPT-2 LM head...) is counted at the ATen level
  with a dispatch mode and added to the *preceding* layer in execution order.

The output format and every counting rule are documented in docs/zoo.md. The script is
deterministic: running it twice writes byte-identical files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# Format version of the files written here; bump it when a field changes meaning.
ZOO_FORMAT = 1

# FLOPs per element of a normalisation layer (BatchNorm2d, LayerNorm) in the forward pass:
# statistics 2 (sum, sum of squares), normalise 1, affine scale and shift 2.
NORM_FLOPS_PER_ELEMENT = 5

# FLOPs per element of a softmax: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS_PER_ELEMENT = 5


# --------------------------------------------------------------------------------------
# Model specifications
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything the zoo needs to know about one model.

    ``reference_parameters`` is the published total; generation fails unless the sum of
    the traced tensors' elements equals it exactly.
    """

    name: str
    display_name: str
    build: Callable[[], nn.Module]
    example_input: Callable[[], Tuple[torch.Tensor, ...]]
    input_desc: str
    default_batch_size: int
    reference_parameters: int
    source: str


def image_input(size: int) -> Callable[[], Tuple[torch.Tensor, ...]]:
    """A batch of one RGB image of ``size`` x ``size`` pixels."""
    return lambda: (torch.zeros(1, 3, size, size),)


def token_input(seq_len: int) -> Callable[[], Tuple[torch.Tensor, ...]]:
    """A batch of one sequence of ``seq_len`` token ids."""
    return lambda: (torch.zeros(1, seq_len, dtype=torch.long),)


def torchvision_model(builder: str, **kwargs) -> Callable[[], nn.Module]:
    """Builder for ``torchvision.models.<builder>(weights=None, **kwargs)``."""
    return lambda: getattr(torchvision.models, builder)(weights=None, **kwargs)


# ---- VGG-16 for CIFAR-10 (Mercury paper, Table II) -----------------------------------

class Vgg16Cifar10(nn.Module):
    """VGG-16 for 32x32 inputs: the 13 conv layers of VGG-16 (configuration D, no batch
    norm) then a 512 -> 4096 -> 4096 -> 10 classifier. After five 2x2 poolings a 32x32
    image is 1x1x512, so no adaptive pooling is needed."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        from torchvision.models.vgg import cfgs, make_layers
        self.features = make_layers(cfgs["D"], batch_norm=False)
        self.classifier = nn.Sequential(
            nn.Linear(512, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


# ---- Transformers (BERT-Base, GPT-2 small) ---------------------------------------------
# Module and parameter names follow Hugging Face's BertModel and GPT2Model so that the
# zoo's tensor names match what users see in their own training scripts. GPT-2's Conv1D
# is an nn.Linear here (same element counts, transposed storage).

@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Published hyper-parameters of a transformer encoder/decoder stack."""

    vocab_size: int
    max_positions: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-12


BERT_BASE = TransformerConfig(vocab_size=30522, max_positions=512, hidden=768, layers=12,
                              heads=12, intermediate=3072, type_vocab_size=2)
GPT2_SMALL = TransformerConfig(vocab_size=50257, max_positions=1024, hidden=768, layers=12,
                               heads=12, intermediate=3072, layer_norm_eps=1e-5)


def multi_head_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                         causal: bool) -> torch.Tensor:
    """Scaled dot-product attention over ``heads`` heads; q, k, v are [B, S, H]."""
    batch, seq, hidden = q.shape

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, seq, heads, hidden // heads).transpose(1, 2)

    q, k, v = split(q), split(k), split(v)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hidden // heads)
    if causal:
        mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    context = torch.matmul(scores.softmax(dim=-1), v)
    return context.transpose(1, 2).reshape(batch, seq, hidden)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        token_types = torch.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_types))
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return multi_head_attention(self.query(x), self.key(x), self.value(x), self.heads,
                                    causal=False)


class BertResidualOutput(nn.Module):
    """Dense projection, residual add, LayerNorm (BertSelfOutput and BertOutput)."""

    def __init__(self, cfg: TransformerConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertResidualOutput(cfg, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertResidualOutput(cfg, cfg.intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class BertModel(nn.Module):
    """BERT encoder with pooler and no task head (Hugging Face ``BertModel``)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.pooler(self.encoder(self.embeddings(input_ids)))


class Gpt2Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.c_proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        return self.c_proj(multi_head_attention(q, k, v, self.heads, causal=True))


class Gpt2Mlp(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.hidden, cfg.intermediate)
        self.c_proj = nn.Linear(cfg.intermediate, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Gpt2Block(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.attn = Gpt2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.mlp = Gpt2Mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2LMHeadModel(nn.Module):
    """GPT-2 with its language-model head tied to the token embedding (``wte``): the head
    is a matmul against ``wte.weight`` and owns no parameters of its own."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.h = nn.ModuleList(Gpt2Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


BERT_SEQ_LEN = 128    # Mercury paper, Table II.
GPT2_SEQ_LEN = 1024   # GPT-2's published context length (n_ctx).

MODELS: List[ModelSpec] = [
    ModelSpec("alexnet", "AlexNet", torchvision_model("alexnet"), image_input(224),
              "3x224x224", 512, 61_100_840, "torchvision 0.14 models.alexnet"),
    ModelSpec("vgg16", "VGG-16", torchvision_model("vgg16"), image_input(224),
              "3x224x224", 32, 138_357_544, "torchvision 0.14 models.vgg16"),
    ModelSpec("vgg19", "VGG-19", torchvision_model("vgg19"), image_input(224),
              "3x224x224", 32, 143_667_240, "torchvision 0.14 models.vgg19"),
    ModelSpec("resnet18", "ResNet-18", torchvision_model("resnet18"), image_input(224),
              "3x224x224", 32, 11_689_512, "torchvision 0.14 models.resnet18"),
    ModelSpec("resnet50", "ResNet-50", torchvision_model("resnet50"), image_input(224),
              "3x224x224", 32, 25_557_032, "torchvision 0.14 models.resnet50"),
    ModelSpec("resnet101", "ResNet-101", torchvision_model("resnet101"), image_input(224),
              "3x224x224", 32, 44_549_160, "torchvision 0.14 models.resnet101"),
    ModelSpec("resnet152", "ResNet-152", torchvision_model("resnet152"), image_input(224),
              "3x224x224", 32, 60_192_808, "torchvision 0.14 models.resnet152"),
    # MobileNet v2 (the Mercury paper's MobileNet, Fig. 3): depthwise separable inverted
    # residual blocks with ReLU6 (ATen hardtanh), width 1.0.
    ModelSpec("mobilenet_v2", "MobileNet v2", torchvision_model("mobilenet_v2"), image_input(224),
              "3x224x224", 32, 3_504_872, "torchvision 0.14 models.mobilenet_v2"),
    # Trained architecture: both auxiliary classifiers (aux1, aux2) included. Without them
    # the total is 6,624,904 (torchvision's published count for the exported weights).
    ModelSpec("googlenet", "GoogLeNet", torchvision_model("googlenet", aux_logits=True,
                                                          init_weights=True),
              image_input(224), "3x224x224", 32, 13_004_888,
              "torchvision 0.14 models.googlenet(aux_logits=True)"),
    # Trained architecture: AuxLogits included (torchvision's published 27,161,264 keeps
    # it too). Without it the total is 23,834,568.
    ModelSpec("inception_v3", "Inception-v3",
              torchvision_model("inception_v3", aux_logits=True, init_weights=True),
              image_input(299), "3x299x299", 32, 27_161_264,
              "torchvision 0.14 models.inception_v3(aux_logits=True)"),
    # Not a published total: derived from the architecture (the paper says ~35M).
    ModelSpec("vgg16_cifar10", "VGG-16 (CIFAR-10)", Vgg16Cifar10, image_input(32),
              "3x32x32", 128, 33_638_218,
              "tools/gen_zoo.py Vgg16Cifar10 (torchvision vgg cfg D convs, 512-4096-4096-10)"),
    ModelSpec("bert_base", "BERT-Base", lambda: BertModel(BERT_BASE),
              token_input(BERT_SEQ_LEN), f"seq {BERT_SEQ_LEN}", 32, 109_482_240,
              "tools/gen_zoo.py BertModel (bert-base-uncased configuration, with pooler)"),
    ModelSpec("gpt2", "GPT-2", lambda: Gpt2LMHeadModel(GPT2_SMALL),
              token_input(GPT2_SEQ_LEN), f"seq {GPT2_SEQ_LEN}", 32, 124_439_808,
              "tools/gen_zoo.py Gpt2LMHeadModel (gpt2 small configuration, tied LM head)"),
]


# --------------------------------------------------------------------------------------
# FLOP counting
# --------------------------------------------------------------------------------------

def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def layer_flops(module: nn.Module, inputs: Tuple[torch.Tensor, ...],
                output: torch.Tensor) -> int:
    """Forward FLOPs of one call of a parameter-owning module (multiply-add = 2)."""
    out_elems = output.numel()
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        macs = module.in_channels // module.groups * kh * kw * out_elems
        return 2 * macs + (out_elems if module.bias is not None else 0)
    if isinstance(module, nn.Linear):
        rows = inputs[0].numel() // module.in_features
        macs = rows * module.in_features * module.out_features
        return 2 * macs + (out_elems if module.bias is not None else 0)
    if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
        return NORM_FLOPS_PER_ELEMENT * out_elems
    if isinstance(module, nn.Embedding):
        return 0  # a gather: memory-bound, see activation_bytes
    raise TypeError(f"no FLOP rule for layer type {type(module).__name__}")


# ATen ops that move or create data without arithmetic.
ZERO_FLOP_OPS = frozenset({
    "_reshape_alias", "_unsafe_view", "alias", "arange", "as_strided", "cat", "clone",
    "detach", "expand", "lift_fresh", "ones", "permute", "select", "slice", "split",
    "t", "transpose", "triu", "unsqueeze", "view", "zeros_like",
})

# ATen ops costing one FLOP per output element.
ELEMENTWISE_OPS = frozenset({
    "add", "add_", "div", "div_", "gelu", "hardtanh", "hardtanh_", "masked_fill", "mul", "mul_",
    "relu", "relu_", "sub", "tanh",
})


def op_flops(name: str, args: Sequence, out) -> Optional[int]:
    """FLOPs of one ATen op run outside any layer, or None when the op is unknown."""
    if name in ZERO_FLOP_OPS:
        return 0
    if name in ELEMENTWISE_OPS:
        return out.numel()
    if name == "_softmax":
        return SOFTMAX_FLOPS_PER_ELEMENT * out.numel()
    if name == "mm":
        (m, k), n = args[0].shape, args[1].shape[1]
        return 2 * m * k * n
    if name == "bmm":
        (b, m, k), n = args[0].shape, args[1].shape[2]
        return 2 * b * m * k * n
    if name in ("max_pool2d", "max_pool2d_with_indices", "avg_pool2d"):
        result = out[0] if isinstance(out, tuple) else out
        kernel = args[1] if len(args[1]) == 2 else list(args[1]) * 2
        return numel(kernel) * result.numel()
    if name in ("_adaptive_avg_pool2d", "adaptive_avg_pool2d", "mean"):
        return args[0].numel()
    return None


class OutsideLayerFlops(TorchDispatchMode):
    """Counts the FLOPs of ATen ops that run while no layer's forward is active and
    hands them to the tracer, which decides which layer gets them. Ops inside a layer
    are skipped: layer_flops() counts those analytically."""

    def __init__(self, tracer: "LayerTracer") -> None:
        super().__init__()
        self.tracer = tracer
        self.unknown: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.tracer.inside_layer():
            name = func.overloadpacket.__name__
            flops = op_flops(name, args, out)
            if flops is None:
                self.unknown[name] = self.unknown.get(name, 0) + 1
            else:
                self.tracer.add_outside_flops(flops)
        return out


# --------------------------------------------------------------------------------------
# Tracing
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Layer:
    name: str
    type: str
    forward_flops: int = 0
    activation_bytes: int = 0
    outside_flops: int = 0  # part of forward_flops from parameter-free work
    tensors: List[Tuple[str, int]] = dataclasses.field(default_factory=list)


class LayerTracer:
    """Records parameter-owning modules in the order they first execute, their FLOPs and
    output sizes, and the parameter-free work attributed to each."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers: List[Layer] = []
        self.owned: Dict[nn.Module, Layer] = {}   # every parameter-owning module
        self.by_module: Dict[nn.Module, Layer] = {}  # those that have run so far
        self.active: List[Layer] = []
        self.pending_flops = 0  # parameter-free work seen before the first layer

    def inside_layer(self) -> bool:
        return bool(self.active)

    def add_outside_flops(self, flops: int) -> None:
        if self.layers:
            self.layers[-1].forward_flops += flops
            self.layers[-1].outside_flops += flops
        else:
            self.pending_flops += flops

    def _pre_hook(self, module: nn.Module, inputs) -> None:
        if self.active:
            raise RuntimeError(f"layer {self.owned[module].name} runs inside layer "
                               f"{self.active[-1].name}: nested layers are not supported")
        layer = self.by_module.get(module)
        if layer is None:
            layer = self.by_module[module] = self.owned[module]
            self.layers.append(layer)
            layer.forward_flops += self.pending_flops
            layer.outside_flops += self.pending_flops
            self.pending_flops = 0
        self.active.append(layer)

    def _post_hook(self, module: nn.Module, inputs, output) -> None:
        layer = self.active.pop()
        layer.forward_flops += layer_flops(module, inputs, output)
        layer.activation_bytes += output.numel() * output.element_size()

    def run(self, inputs: Tuple[torch.Tensor, ...]) -> List[Layer]:
        """Runs one forward pass and returns the layers in execution order."""
        # named_parameters() lists a shared parameter once, under its first owner; the
        # filter below gives it to that owner only, so no tensor is counted twice.
        names = {id(p): n for n, p in self.model.named_parameters()}
        handles = []
        for path, module in self.model.named_modules():
            tensors = [(names[id(p)], p.numel())
                       for n, p in module.named_parameters(recurse=False)
                       if names[id(p)] == f"{path}.{n}"]
            if not tensors:
                continue
            self.owned[module] = Layer(path, type(module).__name__, tensors=tensors)
            handles.append(module.register_forward_pre_hook(self._pre_hook))
            handles.append(module.register_forward_hook(self._post_hook))
        mode = OutsideLayerFlops(self)
        try:
            with torch.no_grad(), mode:
                self.model(*inputs)
        finally:
            for handle in handles:
                handle.remove()
        if mode.unknown:
            raise RuntimeError(f"ATen ops without a FLOP rule: {sorted(mode.unknown)}; "
                               "add them to op_flops()")
        missed = [layer.name for module, layer in self.owned.items()
                  if module not in self.by_module]
        if missed:
            raise RuntimeError(f"layers that never ran in the forward pass: {missed}")
        return self.layers


def prepare_for_trace(model: nn.Module) -> nn.Module:
    """Puts every submodule in eval mode (BatchNorm uses running statistics, dropout is an
    identity) but keeps the root in training mode, so that auxiliary classifiers, which
    torchvision runs only when the root is training, execute in the traced forward."""
    model.eval()
    model.training = True
    return model


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

def profile_of(spec: ModelSpec) -> Tuple[dict, List[Layer]]:
    """Builds, traces and checks one model; returns its JSON object and its layers."""
    torch.manual_seed(0)
    model = prepare_for_trace(spec.build())
    layers = LayerTracer(model).run(spec.example_input())
    total = sum(elements for layer in layers for _, elements in layer.tensors)
    declared = sum(p.numel() for p in model.parameters())
    if total != declared or total != spec.reference_parameters:
        raise SystemExit(f"{spec.name}: traced {total:,} parameters, model declares "
                         f"{declared:,}, reference is {spec.reference_parameters:,}")
    profile = {
        "zoo_format": ZOO_FORMAT,
        "name": spec.name,
        "display_name": spec.display_name,
        "source": spec.source,
        "input": spec.input_desc,
        "default_batch_size": spec.default_batch_size,
        "reference_parameters": spec.reference_parameters,
        "parameters": total,
        "forward_flops": sum(layer.forward_flops for layer in layers),
        "layers": [{
            "name": layer.name,
            "type": layer.type,
            "forward_flops": layer.forward_flops,
            "activation_bytes": layer.activation_bytes,
            "tensors": [{"name": n, "elements": e} for n, e in layer.tensors],
        } for layer in layers],
    }
    return profile, layers


def to_json(profile: dict) -> str:
    """Formats a profile with one line per top-level field, one line per layer header
    and one line per tensor, so files stay small and diff well."""
    dump = lambda value: json.dumps(value, ensure_ascii=True)  # noqa: E731
    lines = ["{"]
    for key, value in profile.items():
        if key != "layers":
            lines.append(f" {dump(key)}: {dump(value)},")
    lines.append(' "layers": [')
    for i, layer in enumerate(profile["layers"]):
        head = ", ".join(f"{dump(k)}: {dump(v)}" for k, v in layer.items() if k != "tensors")
        tensors = ",\n".join(f"    {dump(t)}" for t in layer["tensors"])
        tail = "," if i + 1 < len(profile["layers"]) else ""
        lines.append(f"  {{{head}, \"tensors\": [\n{tensors}]}}{tail}")
    lines.append(" ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    if json.loads(text) != profile:
        raise AssertionError("formatter does not round-trip")
    return text


def summary_row(profile: dict, layers: List[Layer]) -> str:
    outside = sum(layer.outside_flops for layer in layers)
    return (f"{profile['name']:<14} {len(profile['layers']):>6} "
            f"{sum(len(layer['tensors']) for layer in profile['layers']):>7} "
            f"{profile['parameters']:>13,} {profile['forward_flops'] / 1e9:>10.3f} "
            f"{100.0 * outside / profile['forward_flops']:>8.2f}%")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/zoo"),
                        help="directory for <name>.json (default: data/zoo)")
    parser.add_argument("--models", nargs="*", metavar="NAME",
                        choices=[spec.name for spec in MODELS],
                        help="generate only these models (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if a file differs from what would be "
                             "written")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    print(f"{'model':<14} {'layers':>6} {'tensors':>7} {'parameters':>13} "
          f"{'GFLOP/smp':>10} {'param-free':>9}")
    stale = []
    for spec in MODELS:
        if args.models and spec.name not in args.models:
            continue
        profile, layers = profile_of(spec)
        text = to_json(profile)
        path = args.out / f"{spec.name}.json"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
        print(summary_row(profile, layers), flush=True)
    if stale:
        print(f"out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
