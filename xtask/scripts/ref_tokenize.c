// Reference harness of `cargo xtask golden pretok`: loads a vocabulary-only GGUF with the
// cached llama.cpp build (libllama) and prints what its tokenizer does.
//
// Usage: ref_tokenize VOCAB.gguf CASES
// CASES holds one case a line: "<add_special 0|1> <parse_special 0|1> <text as hex>".
// Output, one line each: "n_vocab N", "add_bos 0|1", "eog ID ID ...", then for every case
// "ids ID ID ..." (or "error N" when llama_tokenize fails).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level;
    (void)text;
    (void)user;
}

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s VOCAB.gguf CASES\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], params);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    printf("n_vocab %d\n", n_vocab);
    printf("add_bos %d\n", llama_vocab_get_add_bos(vocab) ? 1 : 0);
    printf("eog");
    for (int32_t id = 0; id < n_vocab; id++) {
        if (llama_vocab_is_eog(vocab, id)) printf(" %d", id);
    }
    printf("\n");

    FILE *cases = fopen(argv[2], "r");
    if (!cases) {
        fprintf(stderr, "cannot open %s\n", argv[2]);
        return 1;
    }
    size_t cap = 1 << 16;
    char *line = malloc(cap);
    char *text = malloc(cap);
    int32_t n_max = 1 << 16;
    llama_token *ids = malloc(sizeof(llama_token) * n_max);
    int add_special, parse_special, used;
    while (fgets(line, (int)cap, cases)) {
        if (sscanf(line, "%d %d %n", &add_special, &parse_special, &used) != 2) continue;
        const char *hex = line + used;
        size_t len = 0;
        while (hex[0] && hex[1] && hex_value(hex[0]) >= 0 && hex_value(hex[1]) >= 0) {
            text[len++] = (char)(hex_value(hex[0]) * 16 + hex_value(hex[1]));
            hex += 2;
        }
        int32_t n = llama_tokenize(vocab, text, (int32_t)len, ids, n_max, add_special != 0,
                                   parse_special != 0);
        if (n < 0) {
            printf("error %d\n", n);
            continue;
        }
        printf("ids");
        for (int32_t i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    fclose(cases);
    free(ids);
    free(text);
    free(line);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
