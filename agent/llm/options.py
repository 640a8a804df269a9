"""The optimize command's LLM flags, kept here so the CLI only wires them in."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kernelbot import KernelbotError
from kernelbot.agent.llm.budget import Budget

if TYPE_CHECKING:
    from kernelbot.agent.llm.loop import LLMOptions


def add_llm_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM generation (litellm; keys from the environment, e.g. OPENAI_API_KEY)")
    g.add_argument("--llm", default=None, metavar="MODEL",
                   help="generate kernels with this litellm model (openai/gpt-4o, anthropic/claude-..., "
                        "hosted_vllm/NAME or openai/NAME with --api-base for a self-hosted server)")
    g.add_argument("--api-base", default=None, metavar="URL", help="OpenAI-compatible endpoint, e.g. "
                                                                  "http://localhost:30000/v1 (SGLang, vLLM)")
    g.add_argument("--samples", type=int, default=2, help="answers per round (default 2)")
    g.add_argument("--repair-rounds", type=int, default=2,
                   help="rounds after the first, each shown the verifier and benchmark reports (default 2)")
    g.add_argument("--max-cost", type=float, default=None, metavar="USD", help="stop the LLM at this spend")
    g.add_argument("--max-tokens", type=int, default=None, help="stop the LLM at this many tokens, all calls")
    g.add_argument("--max-llm-seconds", type=float, default=None,
                   help="wall-time budget of the generate stage with the LLM, verification included")
    g.add_argument("--max-calls-per-task", type=int, default=None, help="cap on LLM calls for one task")
    g.add_argument("--llm-timeout", type=float, default=180.0, help="seconds per LLM request (default 180)")
    g.add_argument("--llm-retries", type=int, default=4, help="retries on rate limits, 5xx and timeouts")
    g.add_argument("--llm-price", default=None, metavar="IN,OUT",
                   help="$ per million input,output tokens, for models litellm has no price for")


def llm_options(args: argparse.Namespace) -> LLMOptions | None:
    from kernelbot.agent.llm.loop import LLMOptions  # torch and the verifier come with it: only for optimize

    if args.llm is None:
        if args.api_base:
            raise KernelbotError("--api-base needs --llm MODEL")
        return None
    price = None
    if args.llm_price:
        try:
            inp, out = (float(x) for x in args.llm_price.split(","))
        except ValueError:
            raise KernelbotError(f"--llm-price wants IN,OUT in $ per million tokens, got {args.llm_price!r}") from None
        price = (inp, out)
    if args.llm_retries < 0:
        raise KernelbotError(f"--llm-retries must be 0 or more, got {args.llm_retries}")
    opts = LLMOptions(model=args.llm, api_base=args.api_base, samples=args.samples, repair_rounds=args.repair_rounds,
                      timeout=args.llm_timeout, max_retries=args.llm_retries, price=price,
                      budget=Budget(max_seconds=args.max_llm_seconds, max_tokens=args.max_tokens,
                                    max_cost=args.max_cost, max_calls_per_task=args.max_calls_per_task))
    opts.check()
    return opts
