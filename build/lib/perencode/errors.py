"""The one exception type the CLI turns into a single red line and exit code 2."""


class UserError(Exception):
    """A mistake the user can fix (bad recipe, missing file, foreign checkpoint...).

    The message must be one line naming the file/field and what is allowed.
    """
