"""VibeVoice's diffusion head as fixed-shape work: every denoising step of a batch in one call, no host syncs.

The engine's scheduler (generation_config: DPMSolverMultistepScheduler, DPM-Solver++,
v-prediction) keeps its state in Python between steps; here its arithmetic is unrolled
over a table made once from the scheduler itself: per step, the timestep, the solver
order it picks (first order at the start and, with `lower_order_final`, at the end),
and its scalar coefficients, computed with the scheduler's own sigmas and the same
torch operations, so that on CPU the latents are the ones the scheduler makes (same
values, same operation order, the same float32 upcast of the sample). One call runs
all the head's passes for a batch (guided: both branches in one pass each step) with
no host sync; static_audio.py runs it over the slot buffers, as a CUDA graph per bucket.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

SOLVERS = ("midpoint", "heun")


def solver_table(scheduler: Any, steps: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """(timesteps [steps] int64, solver order per step, coefficients [steps, 6] float32) of `scheduler`.

    Per step i, from sigmas s = sigmas[i], t = sigmas[i + 1] (and the step before's):
    x0 = c0 * sample - c1 * model_output (v-prediction), then with the sample in float32
    first order: c2 * sample - c3 * x0; second: the same + c4 * (c5 * (x0 - previous x0)).
    """
    cfg = scheduler.config
    supported = (
        type(scheduler).__name__ == "DPMSolverMultistepScheduler"
        and cfg.algorithm_type == "dpmsolver++"
        and cfg.prediction_type == "v_prediction"
        and cfg.solver_type in SOLVERS
        and not cfg.thresholding
    )
    if not supported:
        raise ValueError(
            "vibevoice static decoding runs DPMSolverMultistepScheduler (dpmsolver++, v_prediction, "
            f"midpoint or heun) only; the checkpoint names {type(scheduler).__name__} with {dict(cfg)}; "
            "set engine_extras.kv_cache: dynamic"
        )
    sched = copy.deepcopy(scheduler)
    sched.set_timesteps(num_inference_steps=steps)
    n, sigmas, alpha_sigma = len(sched.timesteps), sched.sigmas, sched._sigma_to_alpha_sigma_t
    orders, rows = [], []
    for i in range(n):
        final = i == n - 1 and (
            cfg.euler_at_final
            or (cfg.lower_order_final and n < 15)
            or cfg.final_sigmas_type == "zero"
        )
        second_final = i == n - 2 and cfg.lower_order_final and n < 15
        if cfg.solver_order == 1 or i < 1 or final:
            order = 1
        elif cfg.solver_order == 2 or i < 2 or second_final:
            order = 2
        else:
            raise ValueError(
                "vibevoice static decoding: third-order DPM-Solver steps are not supported"
            )
        alpha_t, sigma_t = alpha_sigma(sigmas[i + 1])
        alpha_s, sigma_s = alpha_sigma(sigmas[i])
        lambda_t = torch.log(alpha_t) - torch.log(sigma_t)
        lambda_s = torch.log(alpha_s) - torch.log(sigma_s)
        h = lambda_t - lambda_s
        c3 = alpha_t * (torch.exp(-h) - 1.0)
        c4 = c5 = torch.zeros(())
        if order == 2:
            alpha_p, sigma_p = alpha_sigma(sigmas[i - 1])
            r0 = (lambda_s - (torch.log(alpha_p) - torch.log(sigma_p))) / h
            c5 = 1.0 / r0
            c4 = (
                -(0.5 * c3)
                if cfg.solver_type == "midpoint"
                else alpha_t * ((torch.exp(-h) - 1.0) / h + 1.0)
            )
        orders.append(order)
        rows.append(torch.stack([alpha_s, sigma_s, sigma_t / sigma_s, c3, c4, c5]).float())
    return sched.timesteps.clone(), orders, torch.stack(rows)


class Denoiser:
    """The guided denoising loop as fixed-shape work over the table (module docstring)."""

    def __init__(
        self, head: Any, scheduler: Any, steps: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        timesteps, self.orders, coefs = solver_table(scheduler, steps)
        self.head = head
        self.timesteps = timesteps.to(device=device, dtype=dtype)
        self.coefs = coefs.to(device)

    def __call__(
        self, x: torch.Tensor, condition: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        """x [n, latent] noise, condition [2 n, hidden] (conditioned rows, then guidance rows), scale [n, 1]."""
        previous = None
        for i, order in enumerate(self.orders):
            c = self.coefs[i]
            eps = self.head(
                torch.cat([x, x]), self.timesteps[i].expand(2 * x.shape[0]), condition=condition
            )
            cond, uncond = eps.chunk(2)
            v = uncond + scale * (cond - uncond)
            x0 = c[0] * x - c[1] * v
            sample = x.to(torch.float32)
            if order == 1:
                new = c[2] * sample - c[3] * x0
            else:
                new = c[2] * sample - c[3] * x0 + c[4] * (c[5] * (x0 - previous))
            previous, x = x0, new.to(x0.dtype)
        return x
