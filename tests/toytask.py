"""A trivially learnable task for trainer tests: correct when the response starts with `ok`."""

from taut.tasks import Problem, Verdict, register_task


class FirstWordTask:
    name = "toy:first-ok"

    def problems(self, split, n_per_level, seed=0):
        return [Problem(id=f"toy-{i}", prompt=f"add {i % 10} + {i // 10} = <think>", answer="ok", domain="toy", difficulty=1)
                for i in range(min(n_per_level, 40))]

    def verify(self, problem, response, complete):
        words = response.split()
        return Verdict(correct=bool(words) and words[0] == "ok", extracted=words[0] if words else None)

    def with_budget(self, problem, budget):
        return problem


register_task("toy", lambda spec, levels: FirstWordTask())
