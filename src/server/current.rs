//! The server's current model: the one a request that names none runs on. It is the model
//! chosen last (`--default-model`, or a client's choice such as A1111's options), else the
//! image model used or created most recently, else none.

use super::errors::{Api, ApiError};
use super::AppState;
use crate::store::{ModelName, Store, StoredModel};
use axum::http::StatusCode;

/// The image models of the store, read off the async threads.
pub async fn image_models(state: &AppState, api: Api) -> Result<Vec<StoredModel>, ApiError> {
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || image_models_in(&store))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|e| ApiError::new(api, StatusCode::INTERNAL_SERVER_ERROR, e))
}

fn image_models_in(store: &Store) -> Result<Vec<StoredModel>, String> {
    let scan = store.scan().map_err(|e| e.to_string())?;
    Ok(scan
        .models
        .into_iter()
        .filter(|m| crate::generation::check_image_model(store, m).is_ok())
        .collect())
}

/// Whether a stored model is a ControlNet.
pub fn is_controlnet(store: &Store, model: &StoredModel) -> bool {
    let source = crate::loader::StoreSource::new(store, model);
    matches!(
        crate::families::describe_stored_controlnet(&source),
        Some(Ok(_))
    )
}

/// The short names of the stored ControlNets, read off the async threads.
pub async fn controlnets(state: &AppState, api: Api) -> Result<Vec<String>, ApiError> {
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || {
        let scan = store.scan().map_err(|e| e.to_string())?;
        Ok(scan
            .models
            .iter()
            .filter(|m| is_controlnet(&store, m))
            .map(|m| m.name.short())
            .collect())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|e| ApiError::new(api, StatusCode::INTERNAL_SERVER_ERROR, e))
}

/// The current model's name, or a 404 that says how to get one.
pub async fn current_model(state: &AppState, api: Api) -> Result<ModelName, ApiError> {
    if let Some(chosen) = state.chosen_model() {
        return Ok(chosen);
    }
    let models = image_models(state, api).await?;
    let created = models.iter().max_by_key(|m| m.modified);
    let used = state
        .worker
        .last_used()
        .filter(|(name, _)| models.iter().any(|m| &m.name == name));
    let pick = match (used, created) {
        (Some((name, at)), Some(c)) if at >= c.modified => Some(name),
        (Some((name, _)), None) => Some(name),
        (_, Some(c)) => Some(c.name.clone()),
        (None, None) => None,
    };
    pick.ok_or_else(|| {
        ApiError::new(
            api,
            StatusCode::NOT_FOUND,
            "the store holds no image model; import one with `zimage create NAME --from DIR`",
        )
    })
}
