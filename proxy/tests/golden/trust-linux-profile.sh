# >>> agenshield >>> (written by `agenshield proxy install`; uninstall removes it)
export SSL_CERT_FILE='/opt/agenshield/certs/agent-ca-bundle.pem'
export REQUESTS_CA_BUNDLE='/opt/agenshield/certs/agent-ca-bundle.pem'
export CURL_CA_BUNDLE='/opt/agenshield/certs/agent-ca-bundle.pem'
export NODE_EXTRA_CA_CERTS='/opt/agenshield/certs/agent-ca-bundle.pem'
export NPM_CONFIG_CAFILE='/opt/agenshield/certs/agent-ca-bundle.pem'
export GIT_SSL_CAINFO='/opt/agenshield/certs/agent-ca-bundle.pem'
export PIP_CERT='/opt/agenshield/certs/agent-ca-bundle.pem'
export CARGO_HTTP_CAINFO='/opt/agenshield/certs/agent-ca-bundle.pem'
export BUNDLE_SSL_CA_CERT='/opt/agenshield/certs/agent-ca-bundle.pem'
export GRPC_DEFAULT_SSL_ROOTS_FILE_PATH='/opt/agenshield/certs/agent-ca-bundle.pem'
export DENO_CERT='/opt/agenshield/certs/agent-ca-bundle.pem'
export AWS_CA_BUNDLE='/opt/agenshield/certs/agent-ca-bundle.pem'
export CODEX_CA_CERTIFICATE='/opt/agenshield/certs/agent-ca-bundle.pem'
export HEX_CACERTS_PATH='/opt/agenshield/certs/agent-ca-bundle.pem'
case " ${JAVA_TOOL_OPTIONS-} " in *'-Djavax.net.ssl.trustStore=/opt/agenshield/certs/agent-truststore.p12 -Djavax.net.ssl.trustStoreType=PKCS12 -Djavax.net.ssl.trustStorePassword=changeit'*) ;; *) export JAVA_TOOL_OPTIONS="${JAVA_TOOL_OPTIONS:+$JAVA_TOOL_OPTIONS }"'-Djavax.net.ssl.trustStore=/opt/agenshield/certs/agent-truststore.p12 -Djavax.net.ssl.trustStoreType=PKCS12 -Djavax.net.ssl.trustStorePassword=changeit' ;; esac
# <<< agenshield <<<
