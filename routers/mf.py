"""Matrix-factorization router: RouteLLM's MF router (Ong et al. 2024) generalised from a strong/weak pair to
N models.

    router = MFRouter(models, dim=64).fit(train, featurizer.transform(train.prompts))
    quality = router.predict(featurizer.transform(prompts), suites)      # [N, M] probabilities

RouteLLM scores a (model, prompt) pair as w^T (v_m * W e_q): a learned projection W of the prompt embedding
e_q, multiplied elementwise by a learned model embedding v_m, and trains it on pairwise preferences. Here
every model's own correctness is the label, so the score is a logit of that model answering well:

    h_q = W [e_q ; onehot(suite(q))]          W: [d, D + S], h_q: [d]
    q[n, m] = sigmoid(v_m . h_q + b_m)        v: [M, d], b: [M]

fitted by binary cross-entropy on the observed (prompt, model) cells (scores in [0, 1] are soft labels),
with weight decay, full-batch Adam on the CPU (torch). The suite one-hot lets the factorisation learn a
per-task offset for every model; an unseen suite gets the zero vector. Adding a model freezes W and fits
only (v_new, b_new): an L2-regularised logistic regression on the projected prompts h_q.

Each model remembers which kinds of prompt (with tools, without) it was labelled on; on a query of a kind it
has no labels of it is predicted `unseen_quality` (`routers.kinds`, as in kNN), not v_m . h_q + b_m, which
for a model added from tool-calling prompts only is its tool-call accuracy carried over to plain prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from routers.base import Router
from routers.features import Features
from routers.kinds import apply_evidence_rule, check_unseen_quality, kinds_from_state, kinds_state, labelled_kinds
from routers.offline.data import RoutingData


class MFRouter(Router):
    """Prompt-projection x model-embedding router (RouteLLM MF for N models).

    Args:
        models: [M] candidate names.
        dim: d, the latent dimension.
        epochs: full-batch Adam steps.
        lr: Adam learning rate.
        weight_decay: L2 penalty on W and v, added to the loss.
        dropout: dropout on the input (embedding and suite one-hot) while training.
        use_suites: append a one-hot of the training suites to the input.
        add_l2: L2 penalty of the logistic regression that fits an added model's (v, b).
        seed: torch seed of the initialisation.
        num_threads: torch OpenMP threads of the training thread (None: train in the calling thread).
        unseen_quality: the quality predicted for a model without labelled prompts of the query's kind (with
            or without tools), in [0, 1].

    The defaults (weight decay 1e-3, dropout 0.3) won 5-fold CV on RouterBench's train files and on
    RouteLLM's GSM8K folds against weaker regularisation (1e-4, 0.1).

    Raises:
        ValueError: dim < 1, epochs < 1 or unseen_quality outside [0, 1].
    """

    type = "mf"

    def __init__(self, models: Sequence[str], dim: int = 64, epochs: int = 400, lr: float = 3e-3,
                 weight_decay: float = 1e-3, dropout: float = 0.3, use_suites: bool = True, add_l2: float = 1.0,
                 seed: int = 0, num_threads: int | None = 1, unseen_quality: float = 0.0):
        super().__init__(models)
        if dim < 1 or epochs < 1:
            raise ValueError(f"need dim >= 1 and epochs >= 1, got {dim}, {epochs}")
        self.dim, self.epochs, self.lr, self.weight_decay = int(dim), int(epochs), float(lr), float(weight_decay)
        self.dropout, self.use_suites = float(dropout), bool(use_suites)
        self.add_l2, self.seed = float(add_l2), int(seed)
        self.num_threads = None if num_threads is None else int(num_threads)
        self.unseen_quality = check_unseen_quality(unseen_quality)
        self.suites: list[str] = []
        self.projection = np.zeros((0, 0), dtype=np.float32)       # W [d, D + S]
        self.model_embeddings = np.zeros((len(self.models), self.dim), dtype=np.float32)   # v [M, d]
        self.model_bias = np.zeros(len(self.models), dtype=np.float32)                     # b [M]
        self.model_kinds = np.ones((len(self.models), 2), dtype=bool)                      # [M, 2] routers.kinds

    # --- inputs -----------------------------------------------------------------------------------------

    def _inputs(self, features: Features, suites: Sequence[str] | None) -> np.ndarray:
        """[N, D + S] float32: the embedding and the one-hot of a known suite (zeros otherwise)."""
        x = np.asarray(features.embeddings, dtype=np.float32)
        if not self.suites:
            return x
        onehot = np.zeros((len(x), len(self.suites)), dtype=np.float32)
        if suites is not None:
            index = {s: i for i, s in enumerate(self.suites)}
            for n, s in enumerate(suites):
                if s in index:
                    onehot[n, index[s]] = 1.0
        return np.hstack([x, onehot])

    def project(self, features: Features, suites: Sequence[str] | None = None) -> np.ndarray:
        """[N, d] float32 prompt vectors h = W x."""
        return self._inputs(features, suites) @ self.projection.T

    # --- training ---------------------------------------------------------------------------------------

    def fit(self, data: RoutingData, features: Features) -> MFRouter:
        """Fit W, v and b on the observed cells of `data` [P, M] (this router's models) with `features` N = P.

        Raises:
            KeyError: data lacks a model. ValueError: features and data disagree on P, or no observed cell.
        """
        data = self.aligned(data)
        if features.num_rows != data.num_prompts:
            raise ValueError(f"{features.num_rows} feature rows for {data.num_prompts} prompts")
        observed = np.isfinite(data.scores)
        if not observed.any():
            raise ValueError("no observed score to fit on")
        self.suites = sorted(set(data.suites)) if self.use_suites and len(set(data.suites)) > 1 else []
        self.model_kinds = labelled_kinds(data.scores, features.has_tools)
        if self.num_threads is None:
            self._seeded_train(data, features, observed)
            return self
        from concurrent.futures import ThreadPoolExecutor

        from routers.threads import pin_intraop_threads

        # small matrices: on a busy CPU more OpenMP threads only contend. A thread of our own with its own
        # OpenMP count leaves the caller's threads alone (routers/threads.py: why not torch.set_num_threads)
        with ThreadPoolExecutor(1, initializer=pin_intraop_threads, initargs=(self.num_threads,)) as pool:
            pool.submit(self._seeded_train, data, features, observed).result()
        return self

    def _seeded_train(self, data: RoutingData, features: Features, observed: np.ndarray) -> None:
        import torch

        with torch.random.fork_rng():                   # seeds dropout too, without touching the caller's RNG
            torch.manual_seed(self.seed)
            self._train(torch, data, features, observed)

    def _train(self, torch, data: RoutingData, features: Features, observed: np.ndarray) -> None:
        x = torch.from_numpy(self._inputs(features, data.suites))
        y = torch.from_numpy(np.nan_to_num(data.scores).astype(np.float32))
        mask = torch.from_numpy(observed.astype(np.float32))
        gen = torch.Generator().manual_seed(self.seed)
        w = torch.nn.Parameter(torch.randn(self.dim, x.shape[1], generator=gen) / np.sqrt(x.shape[1]))
        v = torch.nn.Parameter(torch.randn(self.num_models, self.dim, generator=gen) / np.sqrt(self.dim))
        b = torch.nn.Parameter(torch.logit(torch.from_numpy(
            np.clip(np.nanmean(data.scores, axis=0), 0.02, 0.98).astype(np.float32))))
        opt = torch.optim.Adam([w, v, b], lr=self.lr)
        drop = torch.nn.Dropout(self.dropout)
        for _ in range(self.epochs):
            opt.zero_grad()
            logits = drop(x) @ w.T @ v.T + b                                    # [P, M]
            bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
            loss = (bce * mask).sum() / mask.sum() + self.weight_decay * (w.square().sum() + v.square().sum())
            loss.backward()
            opt.step()
        self.projection = w.detach().numpy().astype(np.float32)
        self.model_embeddings = v.detach().numpy().astype(np.float32)
        self.model_bias = b.detach().numpy().astype(np.float32)

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Fit only the new model's (v, b) by L2-regularised logistic regression (Newton's method) on the
        frozen projections h of its labelled prompts; W and the other models are unchanged.

        Raises:
            ValueError: `name` is already a candidate, the router is not fitted, no labelled prompt, or
                features and data disagree on P'.
            KeyError: `data` has no column `name`.
        """
        if name in self.models:
            raise ValueError(f"{name!r} is already one of the router's models")
        if self.projection.size == 0:
            raise ValueError("fit the MF router before adding a model")
        y = data.select_models([name]).scores[:, 0]
        keep = np.isfinite(y)
        if not keep.any():
            raise ValueError(f"no labelled prompt for {name!r}")
        h = self.project(features.subset(np.flatnonzero(keep)), [s for s, k in zip(data.suites, keep) if k])
        kinds = labelled_kinds(y[:, None], features.has_tools)                 # [1, 2]
        coef = logistic_regression(np.hstack([h, np.ones((len(h), 1), dtype=np.float32)]), y[keep],
                                   l2=self.add_l2, penalise_last=False)
        self.models.append(name)
        self.model_embeddings = np.vstack([self.model_embeddings, coef[:-1][None, :].astype(np.float32)])
        self.model_bias = np.append(self.model_bias, np.float32(coef[-1]))
        self.model_kinds = np.vstack([self.model_kinds, kinds])

    # --- prediction -------------------------------------------------------------------------------------

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 predicted probability that each model answers each prompt well (`unseen_quality`
        for a model without labels of the prompt's kind)."""
        if self.projection.size == 0:
            raise RuntimeError("the MF router is not fitted")
        logits = self.project(features, suites).astype(np.float64) @ self.model_embeddings.T.astype(np.float64)
        quality = 1.0 / (1.0 + np.exp(-(logits + self.model_bias.astype(np.float64))))
        return apply_evidence_rule(quality, features.has_tools, self.model_kinds, self.unseen_quality)

    # --- persistence ------------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"projection": self.projection, "model_embeddings": self.model_embeddings, "model_bias": self.model_bias,
                  **kinds_state(self.model_kinds)}
        return arrays, {"dim": self.dim, "epochs": self.epochs, "lr": self.lr, "weight_decay": self.weight_decay,
                        "dropout": self.dropout, "use_suites": self.use_suites, "add_l2": self.add_l2,
                        "seed": self.seed, "suites": list(self.suites), "unseen_quality": self.unseen_quality}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> MFRouter:
        router = cls(meta["models"], dim=meta["dim"], epochs=meta["epochs"], lr=meta["lr"],
                     weight_decay=meta["weight_decay"], dropout=meta["dropout"], use_suites=meta["use_suites"],
                     add_l2=meta["add_l2"], seed=meta["seed"], unseen_quality=meta.get("unseen_quality", 0.0))
        router.suites = list(meta["suites"])
        router.projection = np.asarray(arrays["projection"], dtype=np.float32)
        router.model_embeddings = np.asarray(arrays["model_embeddings"], dtype=np.float32)
        router.model_bias = np.asarray(arrays["model_bias"], dtype=np.float32)
        router.model_kinds = kinds_from_state(arrays, len(router.models))
        return router


def logistic_regression(x: np.ndarray, y: np.ndarray, *, l2: float = 1.0, penalise_last: bool = True,
                        iterations: int = 50) -> np.ndarray:
    """Coefficients [F] minimising sum_n BCE(sigmoid(x_n . c), y_n) + l2 / 2 * |c|^2 by Newton's method.

    Args:
        x: [N, F] inputs; y: [N] targets in [0, 1] (soft labels allowed).
        penalise_last: False leaves the last coefficient (an intercept column) unpenalised.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    penalty = np.full(x.shape[1], l2)
    if not penalise_last:
        penalty[-1] = 1e-6
    coef = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ coef)))
        grad = x.T @ (p - y) + penalty * coef
        hess = (x * (p * (1 - p))[:, None]).T @ x + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        coef -= step
        if np.abs(step).max() < 1e-8:
            break
    return coef
