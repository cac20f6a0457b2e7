"""What the FranceConnect look-alike serves and can be told to get wrong: the scopes and claims
FranceConnect publishes, its made-up people, the names of the faults /_control accepts, and the
name of its session cookie."""

#: The identity pivot scopes and the optional ones (docs: "Scopes et claims").
PIVOT_SCOPES = ["openid", "given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry"]
ALL_SCOPES = PIVOT_SCOPES + ["email", "preferred_username"]
CLAIMS = [scope for scope in ALL_SCOPES if scope != "openid"]

#: Made-up people, in FranceConnect's formats: given names separated by spaces, the birth name in
#: capitals, birthdate YYYY-MM-DD (YYYY-01-01 when the month is presumed), gender male|female,
#: birthplace a 5-character INSEE commune code (a letter for Corsica) or "" when born abroad,
#: birthcountry a 5-digit INSEE country code (France 99100).
IDENTITIES = [
    {"given_name": "Angela Claire Louise", "family_name": "DUBOIS", "birthdate": "1962-08-24", "gender": "female",
     "birthplace": "75107", "birthcountry": "99100", "email": "angela.dubois@example.test", "preferred_username": "MARTIN"},
    {"given_name": "Jérôme Éric", "family_name": "LEFÈVRE-ÉTIENNE", "birthdate": "1981-01-01", "gender": "male",
     "birthplace": "", "birthcountry": "99134", "email": "jerome.lefevre@example.test", "preferred_username": ""},
    {"given_name": "Paul-Marie", "family_name": "CASANOVA", "birthdate": "1990-03-01", "gender": "male",
     "birthplace": "2A004", "birthcountry": "99100", "email": "paul.casanova@example.test", "preferred_username": ""},
]

ID_TOKEN_FAULTS = {"wrong_nonce", "missing_nonce", "wrong_aud", "multiple_aud", "wrong_iss", "alg_none",
                   "hs256_public_key", "hs256_wrong_secret", "expired", "iat_future", "unknown_kid", "rotated_kid",
                   "bad_signature", "wrong_acr", "bad_at_hash", "alg_mismatch"}
USERINFO_FAULTS = {"bad_signature", "other_sub", "unsigned"}
CALLBACK_ERRORS = {"invalid_scope", "invalid_request", "server_error", "temporarily_unavailable", "access_denied"}
SESSION_COOKIE = "fc_double_session"  # cookies ignore ports: a name no other server of the suite uses
