"""The one error of the FranceConnect look-alike's routes: a request it refuses with its HTML error page."""


class Problem(Exception):
    """A request FranceConnect answers with its HTML error page."""

    def __init__(self, message, status=400, code="Y000400"):
        super().__init__(message)
        self.status, self.code = status, code
