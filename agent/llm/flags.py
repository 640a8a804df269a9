"""The optimize command's LLM flags: their defaults read from LLMOptions and Budget (agent/llm/llm_options.py), the
values they were given made into those records, a refused value one line naming its flag."""

from __future__ import annotations

import argparse

from kernelbot import KernelbotError
from kernelbot.agent.llm.budget import Budget
from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.flags import default, options


def add_llm_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM generation (litellm; keys from the environment, e.g. OPENAI_API_KEY)")
    g.add_argument("--llm", default=None, metavar="MODEL",
                   help="generate kernels with this litellm model (openai/gpt-4o, anthropic/claude-..., "
                        "hosted_vllm/NAME or openai/NAME with --api-base for a self-hosted server)")
    g.add_argument("--api-base", default=None, metavar="URL", help="OpenAI-compatible endpoint, e.g. "
                                                                  "http://localhost:30000/v1 (SGLang, vLLM)")
    g.add_argument("--samples", type=int, default=default(LLMOptions, "samples"), help="answers per round")
    g.add_argument("--repair-rounds", type=int, default=default(LLMOptions, "repair_rounds"),
                   help="rounds after the first, each shown the verifier and benchmark reports")
    g.add_argument("--max-cost", type=float, default=None, metavar="USD", help="stop the LLM at this spend")
    g.add_argument("--max-tokens", type=int, default=None, help="stop the LLM at this many tokens, all calls")
    g.add_argument("--max-llm-seconds", type=float, default=None,
                   help="wall-time budget of the generate stage with the LLM, verification included")
    g.add_argument("--max-calls-per-task", type=int, default=None, help="cap on LLM calls for one task")
    g.add_argument("--llm-timeout", type=float, default=default(LLMOptions, "timeout"), help="seconds per LLM request")
    g.add_argument("--llm-retries", type=int, default=default(LLMOptions, "max_retries"),
                   help="retries on rate limits, 5xx and timeouts")
    g.add_argument("--llm-price", default=None, metavar="IN,OUT",
                   help="$ per million input,output tokens, for models litellm has no price for")


def llm_options(args: argparse.Namespace) -> LLMOptions | None:
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
    budget = options(Budget, max_seconds=args.max_llm_seconds, max_tokens=args.max_tokens, max_cost=args.max_cost,
                     max_calls_per_task=args.max_calls_per_task)
    return options(LLMOptions, model=args.llm, api_base=args.api_base, samples=args.samples,
                   repair_rounds=args.repair_rounds, timeout=args.llm_timeout, max_retries=args.llm_retries,
                   price=price, budget=budget)
