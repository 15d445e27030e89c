"""The network zoo: small hand-written PyTorch models with random weights.

Nothing is downloaded and torchvision is not used (it does not import next to torch 2.13 here),
so every architecture is spelled out below.  Torch is imported only when a network is built:
``import tensortune.workloads.networks`` must work in a venv without torch.

Attention is written as matmul, scale, mask, softmax, matmul rather than
``scaled_dot_product_attention``, so that the Relax importer sees operators it can legalize
and MetaSchedule gets ordinary matmul/softmax tasks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from tensortune.errors import WorkloadError

if TYPE_CHECKING:
    import torch

Maker = Callable[[], "tuple[torch.nn.Module, tuple[torch.Tensor, ...]]"]


@dataclass(frozen=True)
class NetworkDef:
    """A zoo entry; ``make()`` returns the model in eval mode and its example inputs."""

    name: str
    description: str
    make: Maker


# --------------------------------------------------------------------------------------------
# Module classes.  They subclass torch.nn.Module, so they are defined on first use.


@functools.cache
def _cnn_layers() -> SimpleNamespace:
    from torch import nn

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        )

    def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
        if stride == 1 and cin == cout:
            return nn.Identity()
        return conv_bn(cin, cout, 1, stride)

    class BasicBlock(nn.Module):
        """ResNet-18/34 block: two 3x3 convolutions and a (projected) shortcut."""

        expansion = 1

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                conv_bn(cin, width, 3, stride), nn.ReLU(), conv_bn(width, width, 3)
            )
            self.skip = _shortcut(cin, width, stride)
            self.relu = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.relu(self.body(x) + self.skip(x))

    class Bottleneck(nn.Module):
        """ResNet-50 block: 1x1 reduce, 3x3, 1x1 expand (x4), stride on the 3x3 (v1.5)."""

        expansion = 4

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * self.expansion
            self.body = nn.Sequential(
                conv_bn(cin, width, 1), nn.ReLU(),
                conv_bn(width, width, 3, stride), nn.ReLU(),
                conv_bn(width, cout, 1),
            )  # fmt: skip
            self.skip = _shortcut(cin, cout, stride)
            self.relu = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.relu(self.body(x) + self.skip(x))

    class ResNet(nn.Module):
        def __init__(self, block: type, depths: tuple[int, ...], classes: int = 1000) -> None:
            super().__init__()
            self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            stages: list[nn.Module] = []
            cin = 64
            for i, depth in enumerate(depths):
                width = 64 * 2**i
                for j in range(depth):
                    stages.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                    cin = width * block.expansion
            self.stages = nn.Sequential(*stages)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.stages(self.stem(x)).mean(dim=(2, 3)))

    class SqueezeExcite(nn.Module):
        """Channel attention: global average, a bottleneck of two 1x1 convolutions, sigmoid."""

        def __init__(self, channels: int, squeezed: int) -> None:
            super().__init__()
            self.reduce = nn.Conv2d(channels, squeezed, 1)
            self.expand = nn.Conv2d(squeezed, channels, 1)
            self.act = nn.SiLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = self.expand(self.act(self.reduce(x.mean(dim=(2, 3), keepdim=True))))
            return x * scale.sigmoid()

    class InvertedResidual(nn.Module):
        """MobileNetV2 block: 1x1 expand, KxK depthwise, 1x1 linear projection.  EfficientNet's
        MBConv is the same block with SiLU and a squeeze-excite before the projection
        (stochastic depth is a training device and absent here)."""

        def __init__(self, cin: int, cout: int, stride: int, expand: int, kernel: int = 3,
                     act: type[nn.Module] = nn.ReLU6, excite: bool = False) -> None:  # fmt: skip
            super().__init__()
            hidden = cin * expand
            layers: list[nn.Module] = []
            if expand != 1:
                layers += [conv_bn(cin, hidden, 1), act()]
            layers += [conv_bn(hidden, hidden, kernel, stride, groups=hidden), act()]
            if excite:
                layers.append(SqueezeExcite(hidden, max(1, cin // 4)))
            layers += [conv_bn(hidden, cout, 1)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.body(x) if self.residual else self.body(x)

    class MobileNet(nn.Module):
        """MobileNetV2 and EfficientNet-B0: a strided 3x3 stem, inverted-residual blocks (rows
        of ``config``: expansion, kernel, first stride, output channels, repeats), a 1x1 conv
        to 1280 channels, global average pooling and a linear classifier."""

        def __init__(self, config: tuple[tuple[int, ...], ...], act: type[nn.Module],
                     excite: bool = False, classes: int = 1000) -> None:  # fmt: skip
            super().__init__()
            layers: list[nn.Module] = [conv_bn(3, 32, 3, 2), act()]
            cin = 32
            for expand, k, stride, cout, repeats in config:
                for j in range(repeats):
                    layers.append(InvertedResidual(cin, cout, stride if j == 0 else 1, expand,
                                                   k, act, excite))  # fmt: skip
                    cin = cout
            layers += [conv_bn(cin, 1280, 1), act()]
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x).mean(dim=(2, 3)))

    class VGG(nn.Module):
        """VGG without batch norm (the paper's configurations): 3x3 convolutions and ReLU,
        2x2 max pooling ("M"), then three fully connected layers on the 7x7 map."""

        def __init__(self, config: tuple[int | str, ...], classes: int = 1000) -> None:
            super().__init__()
            layers: list[nn.Module] = []
            cin = 3
            for c in config:
                if c == "M":
                    layers.append(nn.MaxPool2d(2, 2))
                else:
                    layers += [nn.Conv2d(cin, int(c), 3, 1, 1), nn.ReLU()]
                    cin = int(c)
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(
                nn.Linear(cin * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                nn.Linear(4096, classes),
            )  # fmt: skip

            # PyTorch's default initialisation shrinks activations about 1.7x a layer; without
            # batch norms to rescale them, VGG's output would be its last bias whatever the
            # kernels compute.  He initialisation keeps their scale through the ReLUs.
            for m in self.modules():
                if isinstance(m, nn.Conv2d | nn.Linear):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    nn.init.zeros_(m.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x).flatten(1))

    return SimpleNamespace(
        BasicBlock=BasicBlock,
        Bottleneck=Bottleneck,
        ResNet=ResNet,
        MobileNet=MobileNet,
        VGG=VGG,
    )


@functools.cache
def _transformer_layers() -> SimpleNamespace:
    import torch
    from torch import nn

    class SelfAttention(nn.Module):
        """Multi-head self-attention with a fused QKV projection, written out op by op."""

        def __init__(self, dim: int, heads: int, causal_len: int = 0) -> None:
            super().__init__()
            self.heads, self.scale = heads, (dim // heads) ** -0.5
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.causal = causal_len > 0
            if self.causal:
                # additive mask (-inf above the diagonal) so that masking is a plain add
                mask = torch.full((causal_len, causal_len), float("-inf")).triu(1)
                self.register_buffer("mask", mask, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            qkv = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (b, heads, s, head_dim)
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
            if self.causal:
                scores = scores + self.mask[:s, :s]
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            return self.out(ctx.transpose(1, 2).reshape(b, s, d))

    def mlp(dim: int, hidden: int, gelu: str = "none") -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(approximate=gelu), nn.Linear(hidden, dim)
        )

    class PostNormLayer(nn.Module):
        """BERT encoder layer: residual then LayerNorm, around attention and the FFN."""

        def __init__(self, dim: int, heads: int, ffn: int) -> None:
            super().__init__()
            self.attn, self.ffn = SelfAttention(dim, heads), mlp(dim, ffn)
            self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-12), nn.LayerNorm(dim, eps=1e-12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.ffn(x))

    class PreNormLayer(nn.Module):
        """ViT / GPT-2 block: LayerNorm first, residual around each sub-layer."""

        def __init__(
            self, dim: int, heads: int, ffn: int, causal_len: int = 0, gelu: str = "none"
        ) -> None:
            super().__init__()
            self.attn, self.ffn = SelfAttention(dim, heads, causal_len), mlp(dim, ffn, gelu)
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.ffn(self.ln2(x))

    class ViT(nn.Module):
        def __init__(
            self, image: int, patch: int, dim: int, depth: int, heads: int, classes: int = 1000
        ) -> None:
            super().__init__()
            tokens = (image // patch) ** 2 + 1
            self.patch = nn.Conv2d(3, dim, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
            self.blocks = nn.Sequential(*(PreNormLayer(dim, heads, 4 * dim) for _ in range(depth)))
            self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.patch(x).flatten(2).transpose(1, 2)  # (b, patches, dim)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.norm(self.blocks(x))[:, 0])

    return SimpleNamespace(PostNormLayer=PostNormLayer, PreNormLayer=PreNormLayer, ViT=ViT)


# --------------------------------------------------------------------------------------------
# Builders: each returns (model in eval mode, example inputs), with seeded random weights.


def _finish(model: torch.nn.Module, *shape: int) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    import torch

    torch.manual_seed(2)
    _calibrate_batch_norms(model, torch.randn(2, *shape[1:]))
    # seeded again so the input does not depend on how many weights the model drew
    torch.manual_seed(1)
    return model.eval(), (torch.randn(*shape),)


def _calibrate_batch_norms(model: torch.nn.Module, batch: torch.Tensor) -> None:
    """Give each batch norm the mean and variance of what reaches it on ``batch``.

    Fresh batch norms hold identity statistics, under which a randomly initialised
    MobileNetV2's activations shrink about tenfold a block: its output is then its
    classifier's bias, whatever the kernels compute, and comparing outputs checks nothing.
    Calibrated, activations keep their scale through the network."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: one batch sets the statistics
    model.train()
    with torch.no_grad():
        model(batch)
    model.eval()


def _seeded() -> None:
    import torch

    torch.manual_seed(0)


def _resnet(depth: int, batch: int) -> Maker:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        _seeded()
        nets = _cnn_layers()
        if depth == 18:
            model = nets.ResNet(nets.BasicBlock, (2, 2, 2, 2))
        else:
            model = nets.ResNet(nets.Bottleneck, (3, 4, 6, 3))
        return _finish(model, batch, 3, 224, 224)

    return make


# Inverted-residual stages (expansion, kernel, first stride, output channels, repeats), from
# the MobileNetV2 and EfficientNet papers.
MOBILENETV2 = (
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 3, 2, 32, 3), (6, 3, 2, 64, 4),
    (6, 3, 1, 96, 3), (6, 3, 2, 160, 3), (6, 3, 1, 320, 1),
)  # fmt: skip
EFFICIENTNET_B0 = (
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
)  # fmt: skip


def _mobilenetv2(batch: int) -> Maker:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        from torch import nn

        _seeded()
        return _finish(_cnn_layers().MobileNet(MOBILENETV2, nn.ReLU6), batch, 3, 224, 224)

    return make


def _efficientnet_b0() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from torch import nn

    _seeded()
    model = _cnn_layers().MobileNet(EFFICIENTNET_B0, nn.SiLU, excite=True)
    return _finish(model, 1, 3, 224, 224)


# VGG-11 (configuration "A" of the VGG paper): 8 convolutions, 3 fully connected layers
VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def _vgg11() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    _seeded()
    return _finish(_cnn_layers().VGG(VGG11), 1, 3, 224, 224)


def _bert(seq: int, layers: int = 12) -> Maker:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        from torch import nn

        _seeded()
        layer = _transformer_layers().PostNormLayer
        model = nn.Sequential(*(layer(768, 12, 3072) for _ in range(layers)))
        return _finish(model, 1, seq, 768)

    return make


def _vit_tiny() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    _seeded()
    model = _transformer_layers().ViT(image=224, patch=16, dim=192, depth=12, heads=3)
    return _finish(model, 1, 3, 224, 224)


def _gpt2_block(seq: int) -> Maker:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        _seeded()
        model = _transformer_layers().PreNormLayer(768, 12, 3072, causal_len=seq, gelu="tanh")
        return _finish(model, 1, seq, 768)

    return make


_DEFS = (
    NetworkDef("resnet18", "ResNet-18 (BasicBlock 2-2-2-2), input 1x3x224x224", _resnet(18, 1)),
    NetworkDef("resnet18-b4", "ResNet-18, batch 4: input 4x3x224x224", _resnet(18, 4)),
    NetworkDef(
        "resnet50", "ResNet-50 v1.5 (Bottleneck 3-4-6-3), input 1x3x224x224", _resnet(50, 1)
    ),
    NetworkDef("mobilenetv2", "MobileNetV2 (width 1.0), input 1x3x224x224", _mobilenetv2(1)),
    NetworkDef("mobilenetv2-b4", "MobileNetV2, batch 4: input 4x3x224x224", _mobilenetv2(4)),
    NetworkDef(
        "efficientnet-b0",
        "EfficientNet-B0 (MBConv with squeeze-excite, SiLU, 3x3 and 5x5 depthwise), "
        "input 1x3x224x224",
        _efficientnet_b0,
    ),
    NetworkDef("vgg11", "VGG-11 (8 conv 3x3 + 3 FC, no batch norm), input 1x3x224x224", _vgg11),
    NetworkDef(
        "bert-base",
        "BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072), hidden states 1x128x768",
        _bert(128),
    ),
    NetworkDef("bert-base-s64", "BERT-base encoder, seq 64: hidden states 1x64x768", _bert(64)),
    NetworkDef(
        "bert-layer",
        "one BERT-base encoder layer (the same tasks as bert-base, once each), input 1x128x768",
        _bert(128, layers=1),
    ),
    NetworkDef(
        "vit-tiny",
        "ViT-Tiny/16 (dim 192, depth 12, 3 heads, cls token, head), input 1x3x224x224",
        _vit_tiny,
    ),
    NetworkDef(
        "gpt2-block",
        "one GPT-2-small decoder block (768, 12 heads, causal, tanh GELU), input 1x128x768",
        _gpt2_block(128),
    ),
    NetworkDef(
        "gpt2-block-s256",
        "one GPT-2-small decoder block, seq 256: input 1x256x768",
        _gpt2_block(256),
    ),
)

NETWORKS: dict[str, NetworkDef] = {d.name: d for d in _DEFS}


def names_a_file(source: str | os.PathLike[str]) -> bool:
    """Whether a model source names a file (an ONNX model) rather than a zoo network."""
    if not isinstance(source, str):
        return True
    if source in NETWORKS:
        return False
    return source.endswith(".onnx") or os.sep in source or os.path.exists(source)


def check_source(source: str | os.PathLike[str]) -> None:
    """Refuse a name that is neither a file nor a zoo network now (``WorkloadError`` listing
    the known ones), before the minutes of work that come before ``load_model``."""
    if not names_a_file(source):
        get_network(str(source))


def get_network(name: str) -> NetworkDef:
    """The zoo entry called ``name``; ``WorkloadError`` listing the known names otherwise."""
    try:
        return NETWORKS[name]
    except KeyError:
        known = ", ".join(NETWORKS)
        raise WorkloadError(f"unknown network {name!r}; known: {known}") from None
