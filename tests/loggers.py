"""A concrete logger with custom methods, importable by child processes."""

from components.logger import CSVLogger


class CustomLogger(CSVLogger):
    def log_answer(self, question: str) -> int:
        self.log_scalar("answered", 1.0)
        return len(question)

    def log_broken(self) -> None:
        raise KeyError("the SDK rejected this call")
