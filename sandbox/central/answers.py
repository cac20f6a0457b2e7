"""How the central look-alike refuses: Answer, an API error in api-router.ts's JSON shape
(with the reason and detail its stats keep), and PageAnswer, a page's error."""


class Answer(Exception):
    """An API error in the published shape {"status","message"[,"details"]}."""

    def __init__(self, status, message, details=None, reason=None, detail=None):
        super().__init__(message)
        self.status, self.message, self.details = status, message, details
        self.reason, self.detail = reason, detail

    def body(self):
        value = {"status": self.status, "message": self.message}
        if self.details is not None:
            value["details"] = self.details
        return value


class PageAnswer(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message
