"""Small models for every task (random weights, built offline) and the float64 per-example loop
they are checked against, with each task's loss written out here independently of
alcli.tasks. Used by tests/test_tasks.py and benchmarks/tasks.py."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100
CLASSES = 3


class TinyUNet(nn.Module):
    """A two-level U-Net: conv-BN-ReLU down, max-pool, conv, upsample, skip concat, 1x1 head."""

    def __init__(self, classes: int = CLASSES, channels: int = 3, width: int = 4):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.GroupNorm(2, 2 * width), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.head = nn.Conv2d(2 * width, classes, 1)

    def forward(self, x):
        d = self.down(x)                                   # [B, w, H, W]
        m = self.mid(F.max_pool2d(d, 2))                   # [B, 2w, H/2, W/2]
        return self.head(torch.cat([d, self.up(m)], 1))    # [B, C, H, W]


def warm_bn(model: nn.Module) -> nn.Module:
    """BatchNorm running statistics that are not the identity (random, seeded)."""
    g = torch.Generator().manual_seed(3)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def unet():
    torch.manual_seed(0)
    return warm_bn(TinyUNet())


def lraspp():
    import torchvision
    torch.manual_seed(0)
    return warm_bn(torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES))


def fcn():
    import torchvision
    torch.manual_seed(0)
    return warm_bn(torchvision.models.segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, num_classes=CLASSES))


def _bert_config(**kw):
    from transformers import BertConfig
    return BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=37, max_position_embeddings=64, **kw)


def bert_tokens():
    from transformers import BertForTokenClassification
    torch.manual_seed(0)
    return BertForTokenClassification(_bert_config(num_labels=CLASSES)).eval()


def distilbert_tokens():
    from transformers import DistilBertConfig, DistilBertForTokenClassification
    torch.manual_seed(0)
    return DistilBertForTokenClassification(DistilBertConfig(
        vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=37, max_position_embeddings=64,
        num_labels=CLASSES)).eval()


def bert_multilabel():
    from transformers import BertForSequenceClassification
    torch.manual_seed(0)
    return BertForSequenceClassification(_bert_config(
        num_labels=CLASSES, problem_type="multi_label_classification")).eval()


def bert_regression():
    from transformers import BertForSequenceClassification
    torch.manual_seed(0)
    return BertForSequenceClassification(_bert_config(num_labels=1)).eval()


def timm_multilabel():
    import timm
    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False, num_classes=CLASSES).eval()


def mlp_regression(outputs: int = 2):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, outputs)).eval()


def images(n: int, size: int = 32) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def tokens(n: int, length: int = 7) -> dict:
    """A padded batch: example i has length - i % 3 real tokens, the rest padding (mask 0)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 100, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    for i in range(n):
        real = length - i % 3
        ids[i, real:] = 0
        mask[i, real:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def features(n: int) -> torch.Tensor:
    return torch.randn(n, 5, generator=torch.Generator().manual_seed(4))


# --- the oracle: each task's loss written with torch's own losses, one example at a time ----------

def oracle_loss(task: str, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """One example's loss (logits and target of that example, batch dim 1)."""
    if task == "segmentation":
        valid = int((target != IGNORE).sum())
        return F.cross_entropy(logits, target, ignore_index=IGNORE, reduction="sum") / max(valid, 1)
    if task == "token-classification":
        valid = int((target != IGNORE).sum())
        return F.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE, reduction="sum") / max(valid, 1)
    if task == "multilabel":
        return F.binary_cross_entropy_with_logits(logits, target.to(logits.dtype), reduction="sum")
    if task == "regression":
        return F.mse_loss(logits.reshape(1, -1), target.reshape(1, -1).to(logits.dtype), reduction="sum")
    raise ValueError(task)


def _one(inputs, i):
    """Example i as a batch of two copies (BatchNorm2d's batch-1 backward bug, see hf_models)."""
    if isinstance(inputs, dict):
        return {k: v[[i, i]] for k, v in inputs.items()}
    return inputs[[i, i]].double()


def _logits(out):
    if isinstance(out, dict):
        return out["out"] if "out" in out else out["logits"]
    return out.logits if hasattr(out, "logits") else out


def loop_norms(model, inputs, task: str, targets: torch.Tensor) -> torch.Tensor:
    """[B] float64: ||d loss_i / d params|| for every example alone through a float64 copy."""
    m = copy.deepcopy(model).double().eval()
    params = [p for p in m.parameters() if p.requires_grad]
    n = targets.shape[0]
    out = torch.empty(n, dtype=torch.float64)
    for i in range(n):
        logits = _logits(m(**_one(inputs, i)) if isinstance(inputs, dict) else m(_one(inputs, i)))[:1]
        loss = oracle_loss(task, logits, targets[i:i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out[i] = torch.sqrt(sum(g.square().sum() for g in grads if g is not None))
    return out


def loop_jacobian_norms(model, inputs) -> torch.Tensor:
    """[B] float64: ||J_i||_F, the Frobenius norm of example i's outputs' Jacobian, one output at a time."""
    m = copy.deepcopy(model).double().eval()
    params = [p for p in m.parameters() if p.requires_grad]
    n = inputs["input_ids"].shape[0] if isinstance(inputs, dict) else inputs.shape[0]
    out = torch.empty(n, dtype=torch.float64)
    for i in range(n):
        f = _logits(m(**_one(inputs, i)) if isinstance(inputs, dict) else m(_one(inputs, i)))[0].reshape(-1)
        sq = 0.0
        for d in range(f.shape[0]):
            grads = torch.autograd.grad(f[d], params, retain_graph=True, allow_unused=True)
            sq += sum(float(g.square().sum()) for g in grads if g is not None)
        out[i] = sq ** 0.5
    return out
