//! `GET /spec`: the API as a Swagger 2.0 document, the form LibreTranslate's `flask_swagger`
//! serves (its parameters and answers as app.py's docstrings describe them).

use serde_json::{json, Value};

fn error_response(description: &str) -> Value {
    json!({ "description": description, "schema": { "$ref": "#/definitions/error-response" } })
}

fn param(name: &str, ty: Value, required: bool, description: &str) -> Value {
    let mut p =
        json!({ "in": "formData", "name": name, "required": required, "description": description });
    if let (Some(obj), Some(t)) = (p.as_object_mut(), ty.as_object()) {
        obj.extend(t.clone());
    }
    p
}

fn errors() -> Value {
    json!({
        "400": error_response("Invalid request"),
        "403": error_response("Banned or invalid API key"),
        "413": error_response("Body too large"),
        "429": { "description": "Slow down (request limit, or the translation queue is full: see Retry-After)",
                 "schema": { "$ref": "#/definitions/error-slow-down" } },
        "500": error_response("Translation error"),
        "503": error_response("Timed out or shutting down (see Retry-After)"),
    })
}

fn with_errors(ok: Value) -> Value {
    let mut r = errors();
    if let Some(obj) = r.as_object_mut() {
        obj.insert("200".into(), ok);
    }
    r
}

/// The document.
pub fn document() -> Value {
    let api_key = param("api_key", json!({ "type": "string" }), false, "API key");
    let lang_obj = json!({
        "type": "object",
        "properties": {
            "confidence": { "type": "number", "format": "float", "minimum": 0, "maximum": 100, "description": "Confidence value" },
            "language": { "type": "string", "description": "Language code" }
        }
    });
    json!({
        "swagger": "2.0",
        "basePath": "/",
        "info": {
            "title": "attn serve (LibreTranslate API)",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Machine translation with the LibreTranslate 1.9 API, served by attn.",
            "license": { "name": "MIT OR Apache-2.0" }
        },
        "consumes": ["application/json", "application/x-www-form-urlencoded", "multipart/form-data"],
        "produces": ["application/json"],
        "paths": {
            "/translate": { "post": {
                "tags": ["translate"], "summary": "Translate Text",
                "parameters": [
                    param("q", json!({ "type": "string" }), true, "Text(s) to translate (in JSON, a string or an array of strings)"),
                    param("source", json!({ "type": "string" }), true, "Source language code or \"auto\" for auto detection"),
                    param("target", json!({ "type": "string" }), true, "Target language code"),
                    param("format", json!({ "type": "string", "enum": ["text", "html"], "default": "text" }), false, "Format of source text: text (plain text) or html (HTML markup)"),
                    param("alternatives", json!({ "type": "integer", "default": 0 }), false, "Preferred number of alternative translations"),
                    api_key.clone(),
                ],
                "responses": with_errors(json!({ "description": "Translation", "schema": {
                    "type": "object", "required": ["translatedText"],
                    "properties": {
                        "translatedText": { "description": "Translated text(s): a string, or an array for an array" },
                        "detectedLanguage": { "description": "With source auto: an object, or an array of them for an array", "allOf": [lang_obj.clone()] },
                        "alternatives": { "type": "array", "description": "Alternative translations (an array per text for an array)", "items": {} }
                    }
                }}))
            }},
            "/translate_file": { "post": {
                "tags": ["translate"], "summary": "Translate a File", "consumes": ["multipart/form-data"],
                "parameters": [
                    { "in": "formData", "name": "file", "type": "file", "required": true, "description": "File to translate (.txt)" },
                    param("source", json!({ "type": "string" }), true, "Source language code or \"auto\" for auto detection"),
                    param("target", json!({ "type": "string" }), true, "Target language code"),
                    api_key.clone(),
                ],
                "responses": with_errors(json!({ "description": "Translated file", "schema": {
                    "type": "object", "properties": { "translatedFileUrl": { "type": "string", "description": "Translated file url" } }
                }}))
            }},
            "/download_file/{filename}": { "get": {
                "tags": ["translate"], "summary": "Download a translated file (kept 30 minutes)",
                "parameters": [{ "in": "path", "name": "filename", "type": "string", "required": true }],
                "produces": ["text/plain"],
                "responses": { "200": { "description": "The file" }, "404": error_response("No such file") }
            }},
            "/detect": { "post": {
                "tags": ["translate"], "summary": "Detect Language of Text",
                "parameters": [param("q", json!({ "type": "string" }), true, "Text to detect"), api_key],
                "responses": with_errors(json!({ "description": "Detections", "schema": { "type": "array", "items": lang_obj } }))
            }},
            "/languages": { "get": {
                "tags": ["translate"], "summary": "Get Supported Languages",
                "responses": { "200": { "description": "List of supported languages", "schema": {
                    "type": "array", "items": { "type": "object", "properties": {
                        "code": { "type": "string", "description": "Language code" },
                        "name": { "type": "string", "description": "Human-readable language name (in English)" },
                        "targets": { "type": "array", "items": { "type": "string" }, "description": "Supported target language codes" }
                    }}
                }}}
            }},
            "/health": { "get": {
                "tags": ["misc"], "summary": "Health Check",
                "responses": { "200": { "description": "Service is healthy", "schema": {
                    "type": "object", "properties": { "status": { "type": "string", "example": "ok" } }
                }}}
            }},
            "/frontend/settings": { "get": {
                "tags": ["frontend"], "summary": "Retrieve Frontend Settings",
                "responses": { "200": { "description": "frontend settings", "schema": {
                    "type": "object", "properties": {
                        "charLimit": { "type": "integer", "description": "Character input limit for this language (-1 indicates no limit)" },
                        "frontendTimeout": { "type": "integer", "description": "Frontend translation timeout" },
                        "apiKeys": { "type": "boolean", "description": "Whether the API key database is enabled." },
                        "keyRequired": { "type": "boolean", "description": "Whether an API key is required." },
                        "suggestions": { "type": "boolean", "description": "Whether submitting suggestions is enabled." },
                        "filesTranslation": { "type": "boolean", "description": "Whether files translation is enabled." },
                        "supportedFilesFormat": { "type": "array", "items": { "type": "string" }, "description": "Supported files format" },
                        "language": { "type": "object" }
                    }
                }}}
            }},
            "/metrics": { "get": {
                "tags": ["misc"], "summary": "Prometheus metrics", "produces": ["text/plain"],
                "responses": { "200": { "description": "Prometheus text exposition" }, "401": error_response("Unauthorized") }
            }}
        },
        "definitions": {
            "error-response": { "type": "object", "properties": { "error": { "type": "string", "description": "Error message" } } },
            "error-slow-down": { "type": "object", "properties": { "error": { "type": "string", "description": "Reason for slow down" } } }
        }
    })
}
