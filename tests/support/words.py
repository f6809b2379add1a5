"""Words a test can search for one message by."""


def unique_word(n: int) -> str:
    """A word of its own for n, which the stemmer leaves alone and no other n stems to (consonants
    between "q" and "x": "qbx", "qcx" ...; "qby" and "qbi" would both stem to "qbi")."""
    out = ""
    while True:
        out = "bcdfghjklmnprtvw"[n % 16] + out
        n //= 16
        if not n:
            return "q" + out + "x"
