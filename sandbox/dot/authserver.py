"""URLs and DOT customisations for serve.py (imported by Django after setup)."""

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import include, path
from oauth2_provider.oauth2_validators import OAuth2Validator

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="/accounts/login/"), name="logout"),
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
]


class Validator(OAuth2Validator):
    # Claims released for the profile/email scopes (userinfo and ID token).
    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "name": user.get_full_name() or user.username,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "email": user.email,
        }

    def validate_scopes(self, client_id, scopes, client, request, *args, **kwargs):
        if "introspection" in scopes and client_id not in settings.UPSTREAM_INTROSPECTION_CLIENTS:
            return False
        return super().validate_scopes(client_id, scopes, client, request, *args, **kwargs)
