# NOT Ollama: the offline stand-in for ollama/ollama (deploy/cmd/ollama-standin,
# installed as `ollama`). No model weights can be downloaded on a machine
# that needs local images, so this answers Ollama's API without a model:
# the profiles' services start and become healthy, `ollama pull` records the
# model, and every chat is answered 503, which the brain reports as
# model_unavailable. Same layout as the real image: `ollama serve` on
# 0.0.0.0:11434, data in /root/.ollama, a shell for compose's pull step.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY ollama /usr/bin/ollama
ENV OLLAMA_HOST=0.0.0.0:11434
EXPOSE 11434
ENTRYPOINT ["/usr/bin/ollama"]
CMD ["serve"]
