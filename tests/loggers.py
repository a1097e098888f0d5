"""A logger backend with methods of its own, importable by child processes."""

from dataclasses import dataclass

from components.logger import CSVLogger


@dataclass
class CustomLogger(CSVLogger):
    def log_answer(self, question: str) -> int:
        self.write_scalar("answered", 1.0, None)
        return len(question)

    def log_broken(self) -> None:
        raise KeyError("the SDK rejected this call")
